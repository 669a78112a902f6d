"""Helpers of the end-to-end suite: kubectl as a user runs it, polling with a deadline, a bounded load of
streaming chat requests, and the pods' own /metrics."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from support.paths import EXAMPLES, ROOT
from support.waiting import wait_for

CLUSTER_SH = ROOT / "scripts" / "cluster" / "cluster.sh"
MODEL = "smollm2-135m-instruct"
API_PORT, METRICS_PORT = 8000, 9090  # the model pods' ports (skiff_operator.render)


def models_status(base_url: str, key: str | None = None) -> int:
    """GET /v1/models with `key` (None: no Authorization header): the HTTP status."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.get(f"{base_url}/v1/models", headers=headers, timeout=15).status_code


@dataclass
class Cluster:
    kubeconfig: str
    up_seconds: float
    report: dict[str, Any] = field(default_factory=dict)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120) -> str:
        proc = subprocess.run(
            ["kubectl", "--kubeconfig", self.kubeconfig, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}"
            )
        return proc.stdout

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def apply(self, objs: list[dict] | dict, namespace: str | None = None) -> str:
        docs = objs if isinstance(objs, list) else [objs]
        ns = ["-n", namespace] if namespace else []
        return self.kubectl("apply", *ns, "-f", "-", input=yaml.safe_dump_all(docs))

    def service_url(self, namespace: str, name: str) -> str:
        svc = self.get("service", "-n", namespace, name)
        port = svc["spec"]["ports"][0]["port"]
        return f"http://{svc['spec']['clusterIP']}:{port}"

    def clear_leftovers(self, namespaces: tuple[str, ...]) -> None:
        """Etcd data outlives `cluster.sh down`, so an interrupted run's objects can still be here. With no
        operator left to drop its finalizer, a leftover InferenceService would hold its namespace and the
        CRD in Terminating for good: the services are deleted, their finalizers dropped, then the rest."""
        crd = "inferenceservices.skiff.dev"
        if self.kubectl("get", "crd", crd, "--ignore-not-found", "-o", "name").strip():
            self.kubectl("delete", "inferenceservices", "--all", "-A", "--wait=false")
            for item in self.get("inferenceservices", "-A")["items"]:
                meta = item["metadata"]
                self.kubectl(
                    "patch", "-n", meta["namespace"], "inferenceservice", meta["name"],
                    "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                )  # fmt: skip
        self.kubectl("delete", "namespace", *namespaces, "--ignore-not-found", "--timeout=180s", timeout=200)
        self.kubectl(
            "delete", "crd,clusterrole,clusterrolebinding", "-l", "app.kubernetes.io/part-of=skiff",
            "--ignore-not-found", "--timeout=120s", timeout=140,
        )  # fmt: skip
        # Unknown to the server once the kopf CRDs are gone, hence unchecked.
        self.kubectl("delete", "clusterkopfpeerings", "-l", "app.kubernetes.io/part-of=skiff", check=False)

    def ready_pods(self, namespace: str, selector: str) -> list[dict]:
        pods = self.get("pods", "-n", namespace, "-l", selector)["items"]
        return [p for p in pods if not p["metadata"].get("deletionTimestamp") and is_ready(p)]


def is_ready(pod: dict) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", [])
    )


def condition(obj: dict, kind: str) -> str | None:
    for c in obj.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return c["status"]
    return None


def wait_until(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    """Polls a cluster through kubectl and HTTP: a failed command or request counts as "not yet"."""
    tolerate = (AssertionError, httpx.HTTPError, subprocess.TimeoutExpired)
    return wait_for(check, timeout, what, interval=interval, tolerate=tolerate)


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())


def pod_counters(pod_ip: str) -> tuple[float, float]:
    """The pod's own (finished requests, generated tokens) from its Prometheus endpoint (its metrics port)."""
    text = httpx.get(f"http://{pod_ip}:{METRICS_PORT}/metrics", timeout=10).text
    finished = tokens = 0.0
    for line in text.splitlines():
        if line.startswith("skiff:requests_finished_total"):
            finished += float(line.rsplit(" ", 1)[1])
        elif line.startswith("sglang:generation_tokens_total"):
            tokens += float(line.rsplit(" ", 1)[1])
    return finished, tokens


def chat(
    base_url: str,
    content: str,
    max_tokens: int = 24,
    model: str = MODEL,
    timeout: float = 120,
    api_key: str = "unused",
    **extra: object,
) -> str:
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, timeout=timeout, max_retries=0)
    out = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        temperature=0,
        extra_body=extra or None,
    )
    return out.choices[0].message.content or ""


@dataclass
class StreamLoad:
    """`workers` threads each send streaming chat requests one after another until stopped. A request
    counts as failed unless its stream ends with a finish_reason."""

    base_url: str
    workers: int = 3
    max_tokens: int = 16
    sent: int = 0
    ok: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _one(self, client, i: int) -> None:
        finish = None
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Count from {i} to {i + 20}."}],
            max_tokens=self.max_tokens,
            temperature=0,
            stream=True,
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        if finish is None:
            raise RuntimeError("stream ended without a finish_reason")

    def _run(self, w: int) -> None:
        import openai

        client = openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", timeout=120, max_retries=0)
        i = 0
        while not self._stop.is_set():
            with self._lock:
                self.sent += 1
            try:
                self._one(client, w * 1000 + i)
                with self._lock:
                    self.ok += 1
            except Exception as e:  # every failure is recorded, the load goes on
                with self._lock:
                    self.errors.append(f"{type(e).__name__}: {e}")
            i += 1

    def __enter__(self) -> StreamLoad:
        for w in range(self.workers):
            t = threading.Thread(target=self._run, args=(w,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=150)
        assert not any(t.is_alive() for t in self._threads), "a streaming request hung"


def write_report(cluster: Cluster) -> None:
    path = Path(os.environ.get("SKIFF_E2E_REPORT", Path(cluster.kubeconfig).parent / "e2e-report.json"))
    path.write_text(json.dumps(cluster.report, indent=2))

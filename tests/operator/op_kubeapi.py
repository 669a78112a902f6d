"""A real Kubernetes control plane for tests: etcd + kube-apiserver + kube-controller-manager (1.20.2, built
by scripts/install.d/kube.sh) on 127.0.0.1, static-token auth, RBAC. There is no scheduler and no kubelet:
`FakeKubelet` plays the node (it runs init containers' commands as local processes, then marks pods ready)."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

KUBE_CACHE = Path(os.environ.get("SKIFF_KUBE_CACHE", Path.home() / ".cache" / "skiff-kube"))
KUBE_BIN = KUBE_CACHE / "bin"
TOKEN = "skiff-test-admin-token"


def binaries_present() -> bool:
    return all((KUBE_BIN / b).exists() for b in ("etcd", "kube-apiserver", "kube-controller-manager"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ControlPlane:
    def __init__(self) -> None:
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.dir = Path(tempfile.mkdtemp(prefix="skiff-kube-", dir=base))
        self.procs: list[subprocess.Popen] = []
        self.port = _free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = self.dir / "kubeconfig"

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.dir / f"{name}.log", "wb")  # noqa: SIM115 (kept open for the process' lifetime)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def start(self, timeout: float = 90.0) -> None:
        d = self.dir
        subprocess.run(
            ["openssl", "genrsa", "-out", str(d / "sa.key"), "2048"], check=True, capture_output=True
        )
        subprocess.run(
            ["openssl", "rsa", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub")],
            check=True,
            capture_output=True,
        )
        (d / "tokens.csv").write_text(f"{TOKEN},admin,admin,system:masters\n")
        etcd_port, peer_port = _free_port(), _free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._spawn(
            "etcd",
            [
                str(KUBE_BIN / "etcd"),
                "--name",
                "skiff-test",
                "--data-dir",
                str(d / "etcd"),
                "--listen-client-urls",
                etcd_url,
                "--advertise-client-urls",
                etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-cluster",
                f"skiff-test=http://127.0.0.1:{peer_port}",
                "--listen-metrics-urls",
                f"http://127.0.0.1:{_free_port()}",
            ],
        )
        self._spawn(
            "kube-apiserver",
            [
                str(KUBE_BIN / "kube-apiserver"),
                "--etcd-servers",
                etcd_url,
                "--bind-address",
                "127.0.0.1",
                "--advertise-address",
                "127.0.0.1",
                "--secure-port",
                str(self.port),
                "--insecure-port",
                "0",
                "--cert-dir",
                str(d / "certs"),
                "--token-auth-file",
                str(d / "tokens.csv"),
                "--authorization-mode",
                "RBAC",
                "--service-account-key-file",
                str(d / "sa.pub"),
                "--service-account-signing-key-file",
                str(d / "sa.key"),
                "--service-account-issuer",
                "https://kubernetes.default.svc.cluster.local",
                "--api-audiences",
                "https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range",
                "10.96.0.0/16",
                "--disable-admission-plugins",
                "ServiceAccount",
                "--enable-priority-and-fairness=false",
            ],
        )
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "test",
                    "clusters": [
                        {"name": "test", "cluster": {"server": self.url, "insecure-skip-tls-verify": True}}
                    ],
                    "users": [{"name": "admin", "user": {"token": TOKEN}}],
                    "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
                }
            )
        )
        self._wait_ready(timeout)
        self._spawn(
            "kube-controller-manager",
            [
                str(KUBE_BIN / "kube-controller-manager"),
                "--kubeconfig",
                str(self.kubeconfig),
                "--port",
                "0",
                "--secure-port",
                "0",
                "--leader-elect=false",
                "--controllers",
                "deployment,replicaset,garbagecollector,endpoint,endpointslice,namespace,disruption",
                "--service-account-private-key-file",
                str(d / "sa.key"),
                "--use-service-account-credentials=false",
                "--concurrent-gc-syncs",
                "5",
            ],
        )

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{proc.args[0]} exited {proc.returncode}:\n{self.log_tail('kube-apiserver')}"
                        f"\n{self.log_tail('etcd')}"
                    )
            try:
                r = httpx.get(
                    f"{self.url}/readyz",
                    headers={"Authorization": f"Bearer {TOKEN}"},
                    verify=False,
                    timeout=2,
                )
                if r.status_code == 200:
                    return
                last = r.text
            except httpx.HTTPError as e:
                last = str(e)
            time.sleep(0.3)
        raise TimeoutError(
            f"kube-apiserver not ready in {timeout}s: {last}\n{self.log_tail('kube-apiserver')}"
        )

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class FakeKubelet(threading.Thread):
    """Plays the node for pods of the test namespace: runs each init container's command as a local process
    (the model-download step is real: `skiff download` checks the source) and records its exit code and
    message the way the kubelet does; then marks the pod Running and Ready, unless `hold` is set."""

    def __init__(self, core: Any, namespace: str) -> None:
        super().__init__(daemon=True)
        self.core, self.namespace = core, namespace
        self.hold = False
        self.stop_event = threading.Event()
        self.done: set[str] = set()  # uids of pods already handled
        self.ip = 10

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.step()
            except Exception as e:  # noqa: BLE001 - a test helper: keep playing the node
                print(f"fake kubelet: {e!r}")
            self.stop_event.wait(0.3)

    def step(self) -> None:
        pods = self.core.list_namespaced_pod(self.namespace).items
        for pod in pods:
            uid = pod.metadata.uid
            if uid in self.done or pod.metadata.deletion_timestamp or self.hold:
                continue
            self.done.add(uid)
            self._start(pod)

    def _start(self, pod: Any) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        init_statuses = []
        for init in pod.spec.init_containers or []:
            env = {**os.environ, **{e.name: e.value for e in init.env or [] if e.value is not None}}
            env.pop("HOME", None)  # the pod's HOME=/tmp is its own emptyDir; keep the host's here
            proc = subprocess.run(
                init.command + (init.args or []), capture_output=True, text=True, env=env, timeout=120
            )
            message = (proc.stdout + proc.stderr)[-2000:]  # terminationMessagePolicy FallbackToLogsOnError
            init_statuses.append(
                {
                    "name": init.name,
                    "image": init.image,
                    "imageID": "",
                    "ready": proc.returncode == 0,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": proc.returncode,
                            "reason": "Completed" if proc.returncode == 0 else "Error",
                            "message": message,
                            "startedAt": now,
                            "finishedAt": now,
                        }
                    },
                }
            )
            if proc.returncode != 0:
                self._patch(
                    pod,
                    {
                        "phase": "Pending",
                        "initContainerStatuses": init_statuses,
                        "conditions": [
                            {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized"},
                            {"type": "Ready", "status": "False", "reason": "ContainersNotInitialized"},
                        ],
                    },
                )
                return
        self.ip += 1
        containers = [
            {
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": now}},
            }
            for c in pod.spec.containers
        ]
        self._patch(
            pod,
            {
                "phase": "Running",
                "podIP": f"10.244.0.{self.ip}",
                "hostIP": "10.0.0.1",
                "startTime": now,
                "initContainerStatuses": init_statuses,
                "containerStatuses": containers,
                "conditions": [
                    {"type": t, "status": "True", "lastTransitionTime": now}
                    for t in ("Initialized", "ContainersReady", "Ready", "PodScheduled")
                ],
            },
        )

    def _patch(self, pod: Any, status: dict[str, Any]) -> None:
        self.core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": status})

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)


def command_line(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)

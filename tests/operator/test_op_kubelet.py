"""The pod contract end to end: play the kubelet for the Deployment rendered from the embedded example.

The server container's command and env run as a local process; the pod's /tmp emptyDir becomes a temporary
directory, its API-key Secret volume a directory holding the operator's internal-key Secret as the volume's
items name it, and its named container ports free local ports (what a kubelet and kube-proxy would
provide); the test waits on the rendered readiness probe, then chats through the Service's target port
with the key the router would send, and sees a call without it refused.
"""

from __future__ import annotations

import base64
import os
import signal
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from op_helpers import example_crs, with_identity
from skiff_operator.access import internal_key_secret, next_internal_key
from skiff_operator.render import OperatorSettings, desired_children
from support.ports import free_port
from support.process import Process


def _rendered() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    cr = with_identity(example_crs()["embedded-cpu"])
    children = desired_children(cr, OperatorSettings(internal_api_keys=True))
    deployment = next(c for c in children if c["kind"] == "Deployment")
    service = next(c for c in children if c["kind"] == "Service" and c["spec"].get("clusterIP") != "None")
    key, _ = next_internal_key(None, "", now=0.0, min_interval=300)
    return deployment, service, internal_key_secret(cr, key)


def _mount_secret(pod: dict[str, Any], server: dict[str, Any], secret: dict[str, Any], root: Path) -> Path:
    """The kubelet's part for the api-key volume: the Secret's items as files in a directory."""
    volume = next(v for v in pod["volumes"] if v["name"] == "api-key")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    mount = next(m for m in server["volumeMounts"] if m["name"] == "api-key")
    root.mkdir()
    for item in volume["secret"]["items"]:
        (root / item["path"]).write_bytes(base64.b64decode(secret["data"][item["key"]]))
    return Path(mount["mountPath"])


def _local_argv(command: list[str], ports: dict[int, int], mounts: dict[Path, Path]) -> list[str]:
    """The container's command on this host: its ports mapped to free ones, mounted paths to local ones."""
    assert command[:2] == ["skiff", "serve"], command
    argv = [sys.executable, "-m", "skiff.cli", *command[1:]]
    out = []
    for i, arg in enumerate(argv):
        prev = argv[i - 1] if i else ""
        if prev == "--host":
            arg = "127.0.0.1"  # bind where the test can reach it and nothing else
        elif prev in ("--port", "--metrics-port"):
            arg = str(ports[int(arg)])
        for inside, outside in mounts.items():
            if arg.startswith(f"{inside}/"):
                arg = str(outside / Path(arg).relative_to(inside))
        out.append(arg)
    return out


def _local_env(env: list[dict[str, Any]], pod_tmp: Path) -> dict[str, str]:
    out = {
        k: v
        for k, v in os.environ.items()
        if k in ("PATH", "PYTHONPATH", "LANG", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
    }
    for e in env:
        assert "value" in e, f"the embedded example needs no secrets, got {e}"
        value = str(e["value"])
        out[e["name"]] = str(pod_tmp) + value[len("/tmp") :] if value.startswith("/tmp") else value
    return out


def test_rendered_pod_serves_a_chat_answer_through_its_service_port(tmp_path: Path) -> None:
    deployment, service, secret = _rendered()
    pod = deployment["spec"]["template"]["spec"]
    assert not pod.get("initContainers"), "the embedded model needs no download"
    server = next(c for c in pod["containers"] if c["name"] == "server")
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    target = service["spec"]["ports"][0]["targetPort"]
    container_port = ports[target]
    local_port = free_port()
    local_ports = {container_port: local_port, ports["metrics"]: free_port()}
    key_dir = _mount_secret(pod, server, secret, tmp_path / "api-key")
    (internal_key,) = base64.b64decode(secret["data"]["keys"]).decode().split()
    probe = server["readinessProbe"]["httpGet"]
    startup = server["startupProbe"]
    startup_budget = startup["periodSeconds"] * startup["failureThreshold"]
    served = server["command"][server["command"].index("--served-model-name") + 1]

    probe_port = ports[probe["port"]] if isinstance(probe["port"], str) else probe["port"]
    assert probe_port == container_port
    pod_server = Process(
        _local_argv(server["command"], local_ports, {key_dir: tmp_path / "api-key"}),
        env=_local_env(server["env"], tmp_path),
        log_path=tmp_path / "server.log",
        name="pod-server",
    )
    try:
        probe_url = f"http://127.0.0.1:{local_port}{probe['path']}"
        pod_server.wait_http_ok(probe_url, min(startup_budget, 600), interval=2, request_timeout=30)

        base = f"http://127.0.0.1:{local_port}/v1"
        with pytest.raises(openai.AuthenticationError):  # only the router, which holds the key, gets in
            openai.OpenAI(base_url=base, api_key="unused", timeout=120, max_retries=0).models.list()
        client = openai.OpenAI(base_url=base, api_key=internal_key, timeout=120)
        assert [m.id for m in client.models.list().data] == [served]
        reply = client.chat.completions.create(
            model=served,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
            max_tokens=24,
        )
        assert "Paris" in (reply.choices[0].message.content or "")

        pod_server.proc.send_signal(signal.SIGTERM)  # what the kubelet does after the preStop hook
        grace = deployment["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
        assert pod_server.proc.wait(timeout=grace) == 0
    finally:
        pod_server.stop(grace=30)

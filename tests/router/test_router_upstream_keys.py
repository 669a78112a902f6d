"""The router's key to the pods, against a real `skiff serve --null-engine --api-key-file` backend: the pod
refuses anyone without the internal key, the router's clients need none, and a rotation (router and pod
learning the new key at different times, as a Secret reaches each at its own moment) fails no request. Also
`skiff-router --metrics-port` as a real process."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml
from skiff_router.app import RouterConfig, create_app
from skiff_router.discovery import StaticSource
from support.asgi import ServerThread
from support.ports import free_port
from support.serve import PythonService, ServerProcess

pytestmark = pytest.mark.timeout(300)
MODEL = "keyed"


def swap(path, text: str) -> None:
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def backend(tmp_path_factory) -> Iterator[tuple[ServerProcess, object]]:
    keys = tmp_path_factory.mktemp("pod") / "keys"
    keys.write_text("sk-old\n")
    srv = ServerProcess(
        "--null-engine", "--served-model-name", MODEL, "--api-key-file", str(keys), api_key=None
    ).wait_ready()
    yield srv, keys
    srv.stop()


class Router:
    def __init__(self, tmp_path, **config) -> None:
        self.file = tmp_path / "discovery.yaml"
        self.source = StaticSource(self.file, interval=0.05)
        self.write([], [])
        self.app = create_app(self.source, RouterConfig(**config))
        self.server = ServerThread(self.app)
        self.url = f"http://{self.server.address}"

    def write(self, services: list[dict], keys: list[dict]) -> None:
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump({"services": services, "apiKeys": keys}))
        tmp.replace(self.file)
        time.sleep(0.2)

    def complete(self, key: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {"model": MODEL, "prompt": "hello there", "max_tokens": 3}
        return httpx.post(self.url + "/v1/completions", json=body, headers=headers, timeout=60)


@pytest.fixture
def router(tmp_path) -> Iterator[Router]:
    r = Router(tmp_path)
    yield r
    r.server.stop()


def direct(srv: ServerProcess, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    return httpx.post(srv.url + "/v1/completions", json=body, headers=headers, timeout=60).status_code


def test_only_the_router_gets_in_and_its_clients_need_no_pod_key(backend, router):
    srv, _ = backend
    router.write(
        [{"name": "svc", "models": [MODEL], "endpoints": [srv.address], "internalKeys": ["sk-old"]}], []
    )
    assert router.complete().status_code == 200  # an open model: the internal key is the router's business
    r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "hi"}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert direct(srv, "EMPTY") == 401
    # the internal key is never a client key: with --require-api-key it does not open the router
    router.write(
        [{"name": "svc", "models": [MODEL], "endpoints": [srv.address], "internalKeys": ["sk-old"]}],
        [{"name": "team-a", "key": "sk-team-a", "models": [MODEL]}],
    )
    router.app.state.router.config.require_api_key = True
    assert router.complete("sk-old").status_code == 401
    assert router.complete("sk-team-a").status_code == 200


def test_a_rotation_fails_no_request(backend, router):
    srv, pod_keys = backend
    svc = {"name": "svc", "models": [MODEL], "endpoints": [srv.address]}
    statuses: list[int] = []

    def burst(n: int = 4) -> None:
        statuses.extend(router.complete().status_code for _ in range(n))

    try:
        router.write([{**svc, "internalKeys": ["sk-old"]}], [])
        burst()
        # the router sees the new Secret first: the pod still knows only the old key
        router.write([{**svc, "internalKeys": ["sk-new", "sk-old"]}], [])
        burst()
        assert direct(srv, "sk-new") == 401  # really stale: the router got in with its fallback
        swap(pod_keys, "sk-new\nsk-old\n")  # the kubelet refreshes the pod's copy
        deadline = time.monotonic() + 10
        while direct(srv, "sk-new") != 200 and time.monotonic() < deadline:
            burst(1)
        assert direct(srv, "sk-new") == 200
        burst()
        # the next rotation reaches the pod before the router, which still sends a key the pod knows
        swap(pod_keys, "sk-newer\nsk-new\n")
        time.sleep(1.5)  # the runtime re-reads its key file at most once a second
        burst()
        router.write([{**svc, "internalKeys": ["sk-newer", "sk-new"]}], [])
        burst()
        assert direct(srv, "sk-old") == 401
    finally:
        swap(pod_keys, "sk-old\n")
    assert statuses and set(statuses) == {200}, statuses


def test_router_metrics_on_their_own_port(tmp_path):
    static = tmp_path / "discovery.yaml"
    static.write_text(yaml.safe_dump({"services": [], "apiKeys": []}))
    metrics_port = free_port()
    proc = PythonService(
        "skiff_router.main",
        ["--static", str(static), "--host", "127.0.0.1", "--metrics-port", str(metrics_port)],
    )
    try:
        proc.wait_ready(60)
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
        assert metrics.status_code == 200 and "skiff_router_" in metrics.text
        assert httpx.get(proc.url + "/metrics", timeout=10).status_code == 404
        assert httpx.get(f"http://127.0.0.1:{metrics_port}/v1/models", timeout=10).status_code == 404
        assert httpx.get(proc.url + "/v1/models", timeout=10).status_code == 200
    finally:
        proc.stop()

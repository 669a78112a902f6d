"""`skiff-router --workers 2`: two router processes on one port (SO_REUSEPORT) in front of a fake backend."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import httpx
import msgspec
import pytest
import yaml
from fakes import fake_backend
from support.asgi import ServerThread
from support.process import alive, client_per_process, descendants, http_ok
from support.serve import PythonService
from support.waiting import wait_for

pytestmark = pytest.mark.timeout(300)


class Routers:
    def __init__(self, tmp) -> None:
        self.backend = ServerThread(fake_backend("B"))
        self.file = tmp / "discovery.yaml"
        route = {
            "name": "svc",
            "models": ["m"],
            "endpoints": [self.backend.address],
            "strategy": "leastRequests",
        }
        self.file.write_text(yaml.safe_dump({"services": [route]}))
        args = ["--static", str(self.file), "--host", "127.0.0.1", "--workers", "2", "--log-level", "warning"]
        self.router = PythonService("skiff_router.main", args, name="skiff-router")
        self.router.wait_ready(120)

    def per_worker(self) -> dict[int, httpx.Client]:
        """One keep-alive client per router process, keyed by its pid."""
        return client_per_process(self.router.url, lambda c: c.get("/health").json()["pid"], timeout=30)

    def stop(self) -> None:
        self.router.stop()
        self.backend.stop()


@pytest.fixture
def routers(tmp_path) -> Iterator[Routers]:
    r = Routers(tmp_path)
    yield r
    r.stop()


def stream(client: httpx.Client, prompt: str) -> str:
    body = {"model": "m", "prompt": prompt, "max_tokens": 3, "stream": True}
    text = ""
    with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                text += "".join(c["text"] for c in msgspec.json.decode(line[6:])["choices"])
    return text


def routed(client: httpx.Client) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in client.get("/metrics").text.splitlines()
        if line.startswith("skiff_router_routed_total{")
    )


def test_both_processes_route_streams_and_metrics_sum_over_them(routers: Routers) -> None:
    workers = routers.per_worker()
    for client in workers.values():
        for i in range(3):
            assert stream(client, f"p{i}") == "B0 B1 B2 "
        r = client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "B:x"
    assert len(routers.backend.server.config.app.state.requests) == 8
    for client in workers.values():  # whichever process answers, it counts both processes' requests
        assert routed(client) == 8
        assert 'skiff_router_inflight{model="m"} 0.0' in client.get("/metrics").text
        client.close()


def test_sigterm_stops_both_processes(routers: Routers) -> None:
    pids = descendants(routers.router.pid)
    serving = set(routers.per_worker())
    assert routers.router.pid in serving and len(serving & pids) == 1
    routers.router.proc.send_signal(signal.SIGTERM)
    assert routers.router.proc.wait(60) == 0, routers.router.log()
    wait_for(lambda: not any(alive(p) for p in pids), 10, "the second router process to exit")
    assert not http_ok(routers.router.url + "/health", 1)


def test_a_dead_worker_ends_the_router_non_zero(routers: Routers) -> None:
    pids = descendants(routers.router.pid)
    sibling = next(p for p in routers.per_worker() if p != routers.router.pid)
    os.kill(sibling, signal.SIGKILL)
    assert routers.router.proc.wait(60) == 1  # so that Kubernetes restarts it
    wait_for(lambda: not any(alive(p) for p in pids), 10, "every router process to exit")

"""Real `skiff serve` and `skiff-router` processes on 127.0.0.1 (a free port each), with probes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import httpx

from support.ports import free_port
from support.process import Process
from support.waiting import wait_for

API_KEY = "test-key-123"
STARTUP_TIMEOUT = 240.0


def child_env() -> dict[str, str]:
    """This environment, unbuffered, without an API key the test did not ask for."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("SKIFF_API_KEY", None)
    return env


class PythonService(Process):
    """`python -m <module> <args> --port <free port>`, healthy once GET /health answers 200."""

    def __init__(self, module: str, args: list[str], *, name: str | None = None) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"
        argv = [sys.executable, "-m", module, *args, "--port", str(self.port)]
        super().__init__(argv, env=child_env(), name=name or module)

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> PythonService:
        self.wait_http_ok(self.url + "/health", timeout)
        return self

    def metric(self, name: str) -> float:
        """The sum of one metric's samples on this process' Prometheus page."""
        return metric_sum(self.url, name)


class ServerProcess(PythonService):
    """`skiff serve` of the embedded SmolLM2-135M-Instruct (unless `extra` names a model) on CPU."""

    def __init__(self, *extra: str, api_key: str | None = API_KEY, kv_cache_gb: float = 1.0) -> None:
        self.api_key = api_key
        args = [
            "serve",
            "--host",
            "127.0.0.1",
            "--log-level",
            "warning",
            "--cpu-kv-cache-gb",
            str(kv_cache_gb),
        ]
        args += [*extra, *(["--api-key", api_key] if api_key else [])]
        super().__init__("skiff.cli", args, name="skiff-serve")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> ServerProcess:
        try:
            super().wait_ready(timeout)
        except AssertionError:
            self.dump_stacks()
            self.stop()
            raise AssertionError(
                f"skiff serve did not become healthy in {timeout} s:\n{self.log()}"
            ) from None
        return self

    def dump_stacks(self) -> None:
        """Every process of the server prints its threads' stacks into the log (faulthandler on SIGUSR1)."""
        children = subprocess.run(["pgrep", "-P", str(self.pid)], capture_output=True, text=True).stdout
        for pid in [self.pid, *map(int, children.split())]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        time.sleep(2)

    def pids(self) -> dict[str, int]:
        return httpx.get(self.url + "/skiff/processes", timeout=5).json()

    def metrics_text(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10).text

    def integrity(self) -> dict:
        return httpx.get(self.url + "/skiff/integrity", timeout=30).json()

    def wait_idle(self, timeout: float = 30.0) -> dict:
        """The engine's own page accounting once no request is live (stats may lag a step behind)."""

        def idle(report: dict) -> bool:
            stats = report.get("stats") or {}
            return report.get("live") == 0 and stats.get("num_running") == 0 and stats.get("num_queued") == 0

        return wait_for(self.integrity, timeout, "the engine to go idle", until=idle)


def small_backend(name: str, *extra: str) -> ServerProcess:
    """A backend for router tests: the embedded model served as `name`, a small KV pool, one torch thread."""
    args = ["--served-model-name", name, "--num-tokenizers", "1", "--num-threads", "1", *extra]
    return ServerProcess(*args, api_key=None, kv_cache_gb=0.25)


def metric_sum(url: str, name: str) -> float:
    """The sum of one metric's samples in the Prometheus text page at url/metrics."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        series, _, value = line.rpartition(" ")
        if series.split("{")[0] == name:
            total += float(value)
    return total

"""A real `skiff serve` subprocess on 127.0.0.1 (a free port), with helpers to probe it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

API_KEY = "test-key-123"
STARTUP_TIMEOUT = 240.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, *extra: str, api_key: str | None = API_KEY) -> None:
        self.port = free_port()
        self.api_key = api_key
        self.log_path = Path(tempfile.mkstemp(prefix="skiff-serve-", suffix=".log")[1])
        cmd = [
            sys.executable,
            "-m",
            "skiff.cli",
            "serve",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            "--cpu-kv-cache-gb",
            "1.0",
            *extra,
        ]
        if api_key:
            cmd += ["--api-key", api_key]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("SKIFF_API_KEY", None)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (lives as long as the process)
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"skiff serve exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.dump_stacks()
        self.stop()
        raise RuntimeError(f"skiff serve did not become healthy in {timeout} s:\n{self.log()}")

    def dump_stacks(self) -> None:
        """Every process of the server prints its threads' stacks into the log (faulthandler on SIGUSR1)."""
        children = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        for pid in [self.proc.pid, *map(int, children.split())]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        time.sleep(2)

    def pids(self) -> dict[str, int]:
        return httpx.get(self.url + "/skiff/processes", timeout=5).json()

    def metrics_text(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10).text

    def integrity(self) -> dict:
        r = httpx.get(self.url + "/skiff/integrity", timeout=30)
        return r.json()

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode


def wait_idle(server: ServerProcess, timeout: float = 30.0) -> dict:
    """The engine's own page accounting once no request is live (stats may lag a step behind)."""
    deadline = time.monotonic() + timeout
    report: dict = {}
    while time.monotonic() < deadline:
        report = server.integrity()
        stats = report.get("stats") or {}
        if report.get("live") == 0 and stats.get("num_running") == 0 and stats.get("num_queued") == 0:
            return report
        time.sleep(0.2)
    raise AssertionError(f"the engine did not go idle: {report}")

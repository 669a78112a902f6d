"""Real processes for the router integration tests: `skiff serve` backends and a `skiff-router`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from fakes import free_port


class Proc:
    def __init__(self, args: list[str], module: str = "skiff.cli") -> None:
        self.port = free_port()
        self.log_path = Path(tempfile.mkstemp(prefix="skiff-router-test-", suffix=".log")[1])
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (lives as long as the process)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("SKIFF_API_KEY", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args, "--port", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_ready(self, timeout: float) -> Proc:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.proc.args} exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{self.proc.args} not healthy after {timeout}s:\n{self.log()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def serve(name: str, *extra: str) -> Proc:
    """The embedded SmolLM2-135M on CPU with a small KV pool and one torch thread."""
    return Proc(
        [
            "serve",
            "--served-model-name",
            name,
            "--host",
            "127.0.0.1",
            "--log-level",
            "warning",
            "--cpu-kv-cache-gb",
            "0.25",
            "--num-tokenizers",
            "1",
            "--num-threads",
            "1",
            *extra,
        ]
    )


def metric(url: str, name: str) -> float:
    """Sum of one metric's samples in a Prometheus text page."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        series, _, value = line.rpartition(" ")
        if series.split("{")[0] == name:
            total += float(value)
    return total

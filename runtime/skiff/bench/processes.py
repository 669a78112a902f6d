"""A server under benchmark as a child process: start, wait until healthy, CPU time per process, stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import httpx

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    url: str  # http://127.0.0.1:PORT
    log: Path

    @classmethod
    def start(cls, argv: list[str], port: int, log: Path, env: dict[str, str] | None = None) -> ServerProcess:
        """argv: the command after `python -m`, e.g. ["skiff.cli", "serve", ...]; it must listen on port."""
        out = log.open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        return cls(proc, f"http://127.0.0.1:{port}", log)

    def wait_ready(self, path: str = "/health", timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.log.name}: exited with {self.proc.returncode}\n{self.tail()}")
            try:
                if httpx.get(self.url + path, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"{self.log.name}: not ready in {timeout:.0f} s\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        return self.log.read_bytes()[-n:].decode(errors="replace")

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5.0)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds so far of the process and its descendants, summed by process name (Linux /proc)."""
        return cpu_seconds_by_name(self.proc.pid)


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        kids.extend(int(k) for k in task.read_text().split())
    return kids


def cpu_seconds_by_name(root: int) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            todo.extend(_children(pid))
        except (FileNotFoundError, ProcessLookupError):
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        totals[name] += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime
    return dict(totals)

"""Server processes of the serving benchmarks: `skiff serve` or `skiff-router` on a free local port, waited on
until healthy, read through /metrics, and stopped (SIGTERM, then kill)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], port: int, log: Path | None = None, module: str = "skiff.cli") -> subprocess.Popen:
    """`python -m module *args --port port`, its output into log (or this process's own output)."""
    out = log.open("wb") if log is not None else None
    cmd = [sys.executable, "-m", module, *args, "--port", str(port)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if out else None, env=env)


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> float:
    """Seconds until url/health answered 200; raises if proc exits first or the time runs out."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not healthy after {timeout:.0f} s")


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def metric(url: str, name: str) -> float:
    """The sum of one metric's samples (all label sets) on url/metrics."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        s.value for family in text_string_to_metric_families(text) for s in family.samples if s.name == name
    )


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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

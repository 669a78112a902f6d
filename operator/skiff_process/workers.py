"""Several processes serving one HTTP port: `skiff serve --api-workers N` and `skiff-router --workers N`.

Each process listens on its own SO_REUSEPORT socket bound to the same address, and the kernel spreads new
connections over them. The first process (the one started from the command line) serves too; the others
are `Siblings` it spawns and supervises: they learn of a drain from it (SIGTERM) and die with it.

Their Prometheus metrics are kept in prometheus-client's multiprocess mode (one file per process in a
private directory, summed when /metrics is read, whichever process answers). The mode is chosen when
prometheus_client is first imported, so `use_multiprocess_metrics` must run before that import.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Generator
from typing import Any

import uvicorn

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
LISTEN_BACKLOG = 2048  # uvicorn's own default


class SignalledServer(uvicorn.Server):
    """uvicorn that tells `on_signal` of SIGINT/SIGTERM (drain on the first, force on the second) and never
    re-raises the signal after its shutdown: the process still has its children to stop."""

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[int], None]) -> None:
        super().__init__(config)
        self._on_signal = on_signal

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        def handler(sig: int, frame: Any) -> None:
            self._on_signal(sig)
            self.handle_exit(sig, frame)

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, h in previous.items():
                signal.signal(sig, h)


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port that other processes of this user may bind too."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def use_multiprocess_metrics() -> str:
    """Make a fresh metrics directory and select prometheus-client's multiprocess mode for this process
    and every process it starts. Raises if prometheus_client was already imported (too late to switch)."""
    import sys

    if "prometheus_client" in sys.modules and METRICS_DIR_ENV not in os.environ:
        raise RuntimeError("prometheus_client was imported before multiprocess metrics were selected")
    path = tempfile.mkdtemp(prefix="skiff-metrics-")
    os.environ[METRICS_DIR_ENV] = path
    return path


def multiprocess_metrics_dir() -> str | None:
    """The directory of this process's multiprocess metrics, or None when they are in memory."""
    path = os.environ.get(METRICS_DIR_ENV)
    if not path:
        return None
    from prometheus_client import values

    if values.ValueClass is values.MutexValue:  # the variable was set after the import: files unused
        raise RuntimeError(f"${METRICS_DIR_ENV} is set but prometheus_client was imported before it")
    return path


def render_metrics(registry: Any) -> bytes:
    """The Prometheus page: this registry's metrics, summed over every process in multiprocess mode."""
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    path = multiprocess_metrics_dir()
    if path is None:
        return generate_latest(registry)
    merged = CollectorRegistry()
    multiprocess.MultiProcessCollector(merged, path=path)
    return generate_latest(merged)


def remove_metrics_dir(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


class Ready:
    """A sibling's one-shot "my socket listens" signal to the first process (a pipe: no semaphore to leak)."""

    def __init__(self, ctx: Any) -> None:
        self._reader, self._writer = ctx.Pipe(duplex=False)

    def set(self) -> None:
        self._writer.send_bytes(b"1")

    def wait(self, timeout: float) -> bool:
        return self._reader.poll(timeout)


class Siblings:
    """The extra serving processes (indexes 1..n-1): spawned, waited on until listening, signalled, joined.

    `target(index, ready, *args)` runs in each; it sets `ready` once its socket listens."""

    def __init__(self, name: str, count: int, target: Callable[..., None], *args: Any) -> None:
        self.name = name
        ctx = mp.get_context("spawn")
        self.ready = [Ready(ctx) for _ in range(1, count)]
        self.procs = [
            ctx.Process(target=target, args=(i, self.ready[i - 1], *args), name=f"{name}-{i}", daemon=False)
            for i in range(1, count)
        ]

    def start(self) -> None:
        for proc in self.procs:
            proc.start()

    def pids(self) -> dict[str, int]:
        return {proc.name: int(proc.pid or 0) for proc in self.procs}

    def dead(self) -> str | None:
        for proc in self.procs:
            if proc.exitcode is not None:
                return f"{proc.name} process exited with code {proc.exitcode}"
        return None

    def wait_ready(self, timeout: float, alive: Callable[[], str | None] = lambda: None) -> None:
        deadline = time.monotonic() + timeout
        for proc, ready in zip(self.procs, self.ready, strict=True):
            while not ready.wait(0.1):
                problem = self.dead() or alive()
                if problem:
                    raise RuntimeError(problem)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{proc.name} did not start listening in {timeout:.0f} s")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        for proc in self.procs:
            if proc.is_alive() and proc.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, sig)

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` s for every sibling to exit, then kill what is left."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join(2)
        path = os.environ.get(METRICS_DIR_ENV)
        if path and self.procs:
            from prometheus_client import multiprocess

            for proc in self.procs:  # their live gauges (in flight) stop counting
                if proc.pid:
                    multiprocess.mark_process_dead(proc.pid, path)

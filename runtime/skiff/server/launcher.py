"""`skiff serve`: start the pod's processes, wait for all of them, serve HTTP, watch, drain, exit.

Exit codes: 0 after a SIGTERM/SIGINT drain; 1 if the server failed to start or a child process died
(so that Kubernetes restarts the pod).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Generator
from typing import Any

import uvicorn

from skiff.server import protocol as P
from skiff.server.api import create_app, create_metrics_app
from skiff.server.args import ServerArgs
from skiff.server.detokenizer_proc import run_detokenizer
from skiff.server.engine_client import EngineClient
from skiff.server.messages import Shutdown
from skiff.server.metrics import ServerMetrics
from skiff.server.scheduler_proc import run_scheduler
from skiff.server.tokenizer_proc import run_tokenizer

log = logging.getLogger("skiff.serve")
MONITOR_INTERVAL = 0.25


class _Server(uvicorn.Server):
    """uvicorn, with our signal handling: drain on the first signal, force on the second, never re-raise."""

    def __init__(self, config: uvicorn.Config, on_signal: Any) -> None:
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


class _SideServer(uvicorn.Server):
    """A second listener (--metrics-port) in the same loop: the main server owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class Pod:
    def __init__(self, args: ServerArgs) -> None:
        self.args = args
        self.ipc_dir = args.ipc_dir or tempfile.mkdtemp(prefix="skiff-")
        self.endpoints = P.Endpoints.under(self.ipc_dir)
        self.procs: dict[str, mp.process.BaseProcess] = {}
        self.exit_code = 0
        self.client: EngineClient | None = None

    def spawn(self) -> None:
        ctx = mp.get_context("spawn")
        targets: dict[str, tuple[Any, tuple[Any, ...]]] = {
            "scheduler": (run_scheduler, (self.args, self.endpoints)),
            "detokenizer": (run_detokenizer, (self.args, self.endpoints)),
        }
        for i in range(self.args.num_tokenizers):
            targets[f"tokenizer-{i}"] = (run_tokenizer, (self.args, self.endpoints, i))
        for name, (fn, fargs) in targets.items():
            proc = ctx.Process(target=fn, args=fargs, name=f"skiff-{name}", daemon=False)
            proc.start()
            self.procs[name] = proc

    def dead_child(self) -> str | None:
        for name, proc in self.procs.items():
            if proc.exitcode is not None:
                return f"{name} process exited with code {proc.exitcode}"
        return None

    def stop_children(self, timeout: float = 10.0, rank_pids: list[int] | None = None) -> None:
        for name, proc in self.procs.items():
            if proc.is_alive() and name != "scheduler":
                proc.terminate()
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs.values():
            if proc.is_alive():
                proc.kill()
                proc.join(2)
        scheduler = self.procs.get("scheduler")
        if scheduler is not None and scheduler.exitcode not in (0, None):
            for pid in rank_pids or []:  # TP ranks orphaned by a scheduler that died without stopping them
                if _is_spawned_python(pid):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.ipc_dir, ignore_errors=True)

    async def monitor(self, client: EngineClient, server: _Server) -> None:
        drain_deadline = None
        while True:  # keeps watching during a drain: a child dying then must still fail in-flight work
            problem = self.dead_child() or client.dead
            if problem:
                client.mark_dead(problem)
                self.exit_code = 1
                server.should_exit = True
                return
            if client.draining and drain_deadline is None:
                drain_deadline = time.monotonic() + self.args.grace_period
            if drain_deadline is not None and time.monotonic() > drain_deadline and client.requests:
                # grace is over: end what is left with an error rather than cutting connections
                client.fail_all(
                    f"the server is shutting down (grace period of {self.args.grace_period:.0f} s is over)"
                )
            await asyncio.sleep(MONITOR_INTERVAL)

    async def serve(self) -> int:
        metrics = ServerMetrics(self.args.model_name)
        client = self.client = EngineClient(self.endpoints, metrics)
        self.spawn()
        expected = set(self.procs)
        print(f"Loading {self.args.model_name} (tp={self.args.engine.tp}) ...", flush=True)
        t0 = time.monotonic()
        try:
            await client.wait_ready(expected, self.dead_child, self.args.startup_timeout)
        except RuntimeError as e:
            print(f"skiff serve: startup failed: {e}", file=sys.stderr, flush=True)
            client.close()
            return 1
        metrics.set_cache_config(client.info.page_size or self.args.engine.page_size, client.info.total_pages)
        client.info.pids = {name: int(proc.pid or 0) for name, proc in self.procs.items()}
        client.start()
        app = create_app(self.args, client)
        config = uvicorn.Config(
            app,
            host=self.args.host,
            port=self.args.port,
            log_level=self.args.log_level,
            timeout_graceful_shutdown=int(self.args.grace_period) + 5,
            access_log=False,
            lifespan="off",
        )
        server = _Server(config, lambda sig: setattr(client, "draining", True))
        side = self._metrics_server(client)
        side_task = asyncio.ensure_future(side.serve()) if side else None
        if side is not None and side_task is not None and not await _bound(side, side_task):
            print(f"skiff serve: cannot listen on --metrics-port {self.args.metrics_port}", file=sys.stderr)
            client.fail_all("the server could not start")
            client.close()
            return 1
        watcher = asyncio.ensure_future(self.monitor(client, server))
        print(
            f"Skiff is serving {self.args.model_name} at http://{self.args.host}:{self.args.port}/v1 "
            f"(ready in {time.monotonic() - t0:.1f} s)",
            flush=True,
        )
        try:
            await server.serve()
        finally:
            watcher.cancel()
            if side is not None and side_task is not None:
                side.should_exit = True
                with contextlib.suppress(SystemExit):
                    await side_task
            if server.started is False and self.exit_code == 0:
                self.exit_code = 1  # could not bind the port
            client.fail_all("the server is shutting down")
            if client.to_scheduler is not None and not client.dead:
                client.to_scheduler.send(Shutdown())
                await asyncio.sleep(0.05)
            client.close()
        return self.exit_code

    def _metrics_server(self, client: EngineClient) -> _SideServer | None:
        if self.args.metrics_port is None:
            return None
        config = uvicorn.Config(
            create_metrics_app(client),
            host=self.args.host,
            port=self.args.metrics_port,
            log_level=self.args.log_level,
            access_log=False,
            lifespan="off",
        )
        return _SideServer(config)


async def _bound(side: uvicorn.Server, task: asyncio.Future) -> bool:
    """Wait until the side listener is up; False if it gave up (uvicorn exits when it cannot bind)."""
    while not side.started and not task.done():
        await asyncio.sleep(0.01)
    if task.done():
        with contextlib.suppress(SystemExit, Exception):
            task.result()
        return False
    return True


def _is_spawned_python(pid: int) -> bool:
    """Still a multiprocessing child (and not a new process that reused the id)?"""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"multiprocessing" in f.read()
    except OSError:
        return False


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def serve(args: ServerArgs) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    pod = Pod(args)
    # until uvicorn takes over the signals, a SIGTERM during loading stops the children and exits non-zero
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        code = asyncio.run(pod.serve())
    except KeyboardInterrupt:
        code = 1
    finally:
        pod.stop_children(rank_pids=pod.client.info.rank_pids if pod.client else None)
    return code

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
from skiff_contract.tracing import TracingUnavailable
from skiff_contract.tracing import configure as configure_tracing
from skiff_process.workers import Siblings, listen_socket, remove_metrics_dir

from skiff.server import protocol as P
from skiff.server.api import create_metrics_app
from skiff.server.args import ServerArgs
from skiff.server.detokenizer_proc import run_detokenizer
from skiff.server.engine_client import EngineClient
from skiff.server.http_server import http_server, run_api_worker, watch
from skiff.server.messages import ChildFailed, Shutdown
from skiff.server.metrics import ServerMetrics
from skiff.server.scheduler_proc import run_scheduler
from skiff.server.tokenizer_proc import run_tokenizer

log = logging.getLogger("skiff.serve")


class _SideServer(uvicorn.Server):
    """A second listener (--metrics-port) in the same loop: the main server owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class Pod:
    def __init__(self, args: ServerArgs) -> None:
        self.args = args
        self.ipc_dir = args.ipc_dir or tempfile.mkdtemp(prefix="skiff-")
        self.endpoints = P.Endpoints.under(self.ipc_dir, args.api_workers, args.detokenizer_workers)
        self.procs: dict[str, mp.process.BaseProcess] = {}
        self.siblings: Siblings | None = None  # API workers 1..n-1
        self.exit_code = 0
        self.client: EngineClient | None = None

    def spawn(self) -> None:
        ctx = mp.get_context("spawn")
        targets: dict[str, tuple[Any, tuple[Any, ...]]] = {
            "scheduler": (run_scheduler, (self.args, self.endpoints)),
        }
        detoks = self.args.detokenizer_workers
        for i in range(detoks):
            name = "detokenizer" if detoks == 1 else f"detokenizer-{i}"
            targets[name] = (run_detokenizer, (self.args, self.endpoints, i))
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
        return self.siblings.dead() if self.siblings is not None else None

    def start_siblings(self, client: EngineClient, port: int) -> None:
        """API workers 1..n-1 on the port worker 0 (this process) listens on; returns once all listen."""
        n = self.args.api_workers
        self.siblings = Siblings("api", n, run_api_worker, self.args, self.endpoints, client.info, port)
        self.siblings.start()
        self.siblings.wait_ready(self.args.startup_timeout, self.dead_child)
        client.info.pids |= self.siblings.pids()

    def tell_siblings(self, client: EngineClient, problem: str) -> None:
        """The pod is done: every other API worker fails its in-flight requests and exits non-zero."""
        for addr in self.endpoints.api[1:]:
            P.outbox(client.ctx, addr).send(ChildFailed("a process of the pod", problem))

    def stop_children(self, timeout: float = 10.0, rank_pids: list[int] | None = None) -> None:
        if self.siblings is not None:
            self.siblings.signal(signal.SIGTERM)
            self.siblings.join(timeout)
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
        remove_metrics_dir(self.args.metrics_dir)

    def on_signal(self, client: EngineClient, sig: int) -> None:
        client.draining = True
        if self.siblings is not None:  # Kubernetes signals only this process: every worker drains
            self.siblings.signal(signal.SIGTERM)

    async def serve(self) -> int:
        try:
            tracing = configure_tracing("skiff-serve", self.args.otlp_traces_endpoint)
        except TracingUnavailable as e:
            print(f"skiff serve: {e}", file=sys.stderr, flush=True)
            return 2
        metrics = ServerMetrics(self.args.model_name)
        client = self.client = EngineClient(self.endpoints, metrics)
        self.spawn()
        expected = set(self.procs)
        print(f"Loading {self.args.model_name} (tp={self.args.engine.tp}) ...", flush=True)
        t0 = time.monotonic()
        sock = None
        try:
            await client.wait_ready(expected, self.dead_child, self.args.startup_timeout)
            metrics.set_cache_config(
                client.info.page_size or self.args.engine.page_size, client.info.total_pages
            )
            client.info.pids = {name: int(proc.pid or 0) for name, proc in self.procs.items()}
            if self.args.api_workers > 1:
                sock = listen_socket(self.args.host, self.args.port)
                self.start_siblings(client, sock.getsockname()[1])
        except (RuntimeError, OSError) as e:
            print(f"skiff serve: startup failed: {e}", file=sys.stderr, flush=True)
            client.close()
            return 1
        client.start()
        server = http_server(self.args, client, lambda sig: self.on_signal(client, sig), tracing)
        side = self._metrics_server(client)
        side_task = asyncio.ensure_future(side.serve()) if side else None
        if side is not None and side_task is not None and not await _bound(side, side_task):
            print(f"skiff serve: cannot listen on --metrics-port {self.args.metrics_port}", file=sys.stderr)
            client.fail_all("the server could not start")
            client.close()
            return 1
        watcher = asyncio.ensure_future(watch(client, server, self.args.grace_period, self.dead_child))
        workers = f", {self.args.api_workers} API workers" if self.args.api_workers > 1 else ""
        print(
            f"Skiff is serving {self.args.model_name} at http://{self.args.host}:{self.args.port}/v1 "
            f"(ready in {time.monotonic() - t0:.1f} s{workers})",
            flush=True,
        )
        try:
            await server.serve(sockets=[sock] if sock is not None else None)
        finally:
            failed = watcher.done() and not watcher.cancelled() and watcher.result()
            watcher.cancel()
            if side is not None and side_task is not None:
                side.should_exit = True
                with contextlib.suppress(SystemExit):
                    await side_task
            if failed:
                self.exit_code = 1
                if self.siblings is not None:
                    self.tell_siblings(client, client.dead or "the pod failed")
            if server.started is False and self.exit_code == 0:
                self.exit_code = 1  # could not bind the port
            if self.siblings is not None:  # they drain what they hold before the engine stops
                self.siblings.signal(signal.SIGTERM)
                await asyncio.to_thread(self.siblings.join, self.args.grace_period + 10)
            client.fail_all("the server is shutting down")
            if client.to_scheduler is not None and not client.dead:
                client.to_scheduler.send(Shutdown())
                await asyncio.sleep(0.05)
            client.close()
            if tracing is not None:
                tracing.shutdown()  # export the spans still buffered
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

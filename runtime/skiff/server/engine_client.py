"""The API process's view of the pod: submits prompts, routes outputs to waiting requests, tracks health."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from skiff.params import SamplingParams
from skiff.server import protocol as P
from skiff.server.messages import (
    AbortRequest,
    ChildFailed,
    DecodeOptions,
    DetokenizedChunk,
    DetokenizedChunks,
    DetokenizerReady,
    EngineReady,
    IntegrityCheck,
    IntegrityReport,
    Message,
    Prompt,
    RequestFailed,
    SchedulerStats,
    ToApi,
    TokenizeRequest,
    TokenizerReady,
)
from skiff.server.metrics import ServerMetrics

log = logging.getLogger("skiff.api")

HEARTBEAT_TIMEOUT = 30.0  # seconds without a stats message before the scheduler counts as hung


@dataclass
class _Tracked:
    sink: asyncio.Queue[tuple[int, DetokenizedChunk | RequestFailed]]
    index: int
    arrival: float
    last: float | None = None
    tokens: int = 0


@dataclass
class PodInfo:
    max_context_len: int = 0
    eos_token_ids: list[int] = field(default_factory=list)
    probe_ids: list[int] = field(default_factory=lambda: [0])
    vocab_size: int = 0
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    page_size: int = 0
    total_pages: int = 0
    pids: dict[str, int] = field(default_factory=dict)  # child process ids by role (for operators and tests)
    rank_pids: list[int] = field(default_factory=list)  # the scheduler's own children (TP ranks 1..n-1)


class EngineClient:
    """One API worker's (`worker`: its index in `endpoints.api`) connection to the pod's other processes."""

    def __init__(self, endpoints: P.Endpoints, metrics: ServerMetrics, worker: int = 0) -> None:
        self.endpoints = endpoints
        self.metrics = metrics
        self.worker = worker
        self.ctx = zmq.asyncio.Context()
        self.inbox = P.pull_socket(self.ctx, endpoints.api[worker], bind=True)
        self.decode = P.Decoder("api", ToApi)
        self.to_tokenizer = P.outbox(self.ctx, endpoints.tokenizer[worker], bind=True)
        self.to_scheduler: P.Outbox | None = None
        self.info = PodInfo()
        self.requests: dict[str, _Tracked] = {}
        self.stats = SchedulerStats(None, 0.0)
        self.last_heartbeat = 0.0
        self.dead: str | None = None  # why the pod can no longer serve
        self.draining = False
        self._replies: dict[int, asyncio.Future[IntegrityReport]] = {}
        self._ids = itertools.count()
        self._reader: asyncio.Task[None] | None = None

    # --- startup -------------------------------------------------------------------------------
    async def wait_ready(self, expected: set[str], alive: Any, timeout: float) -> None:
        """Collect every child's `*Ready`; raise if one reports a fatal error, dies, or time runs out."""
        deadline = time.monotonic() + timeout
        pending = set(expected)
        while pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {sorted(pending)} to start")
            problem = alive()
            if problem:
                raise RuntimeError(problem)
            if not await self.inbox.poll(200):
                continue
            try:
                msg = self.decode(await self.inbox.recv())
            except P.ProtocolError:
                log.exception("dropped a message")
                continue
            match msg:
                case ChildFailed(who=who, message=message):
                    raise RuntimeError(f"{who} failed to start: {message}")
                case TokenizerReady() | DetokenizerReady() | EngineReady():
                    pending.discard(msg.who)
                    self._absorb_ready(msg)
                    elapsed = timeout - (deadline - time.monotonic())
                    detail = ""
                    if isinstance(msg, EngineReady):
                        detail = (
                            f": {self.info.total_pages} KV pages of {msg.stats.page_size} tokens, "
                            f"context {msg.max_context_len}"
                        )
                    print(f"  {msg.who} ready after {elapsed:.1f} s{detail}", flush=True)
                case SchedulerStats():
                    self._on_stats(msg)
        self.to_scheduler = P.outbox(self.ctx, self.endpoints.scheduler)
        self.last_heartbeat = time.monotonic()

    def adopt(self, info: PodInfo) -> None:
        """An extra API worker: the first one collected the pod's readiness and passes what it learnt."""
        self.info = info
        self.to_scheduler = P.outbox(self.ctx, self.endpoints.scheduler)
        self.last_heartbeat = time.monotonic()

    def _absorb_ready(self, msg: TokenizerReady | DetokenizerReady | EngineReady) -> None:
        match msg:
            case EngineReady():
                self.info.max_context_len = msg.max_context_len
                self.info.eos_token_ids = msg.eos_token_ids
                self.info.page_size = msg.stats.page_size
                self.info.total_pages = msg.stats.total_pages
                self.info.rank_pids = list(msg.rank_pids)
                self._on_stats(SchedulerStats(msg.stats, 0.0))
            case TokenizerReady():
                self.info.probe_ids = msg.probe_ids
                self.info.vocab_size = msg.vocab_size
                self.info.tool_parser, self.info.reasoning_parser = msg.tool_parser, msg.reasoning_parser

    def start(self) -> None:
        self._reader = asyncio.get_running_loop().create_task(self._read_loop())

    # --- requests ------------------------------------------------------------------------------
    def submit(
        self,
        prompt: Prompt,
        sampling: list[SamplingParams],
        max_tokens: int | None,
        decode: DecodeOptions,
        sink: asyncio.Queue[tuple[int, DetokenizedChunk | RequestFailed]],
        first_index: int,
        rid_base: str,
    ) -> list[str]:
        """Send one prompt, fanned out to len(sampling) engine requests; their outputs land in `sink`."""
        now = time.monotonic()
        rids = [f"{rid_base}-{first_index + i}" for i in range(len(sampling))]
        for i, rid in enumerate(rids):
            self.requests[rid] = _Tracked(sink, first_index + i, now)
        self.to_tokenizer.send(TokenizeRequest(rids, prompt, sampling, max_tokens, decode, self.worker))
        self.metrics.inflight.set(len(self.requests))
        return rids

    def abort(self, rid: str) -> None:
        if self.requests.pop(rid, None) is not None and self.to_scheduler is not None and not self.dead:
            self.to_scheduler.send(AbortRequest(rid))
        self.metrics.inflight.set(len(self.requests))

    async def check_integrity(self, timeout: float = 10.0) -> IntegrityReport:
        assert self.to_scheduler is not None
        cid = next(self._ids)
        fut: asyncio.Future[IntegrityReport] = asyncio.get_running_loop().create_future()
        self._replies[cid] = fut
        self.to_scheduler.send(IntegrityCheck(cid, self.worker))
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._replies.pop(cid, None)

    def fail_all(self, message: str, status: int = 503) -> None:
        for rid, tracked in self.requests.items():
            tracked.sink.put_nowait((tracked.index, RequestFailed(rid, status, message)))
        self.requests.clear()
        self.metrics.inflight.set(0)

    def health_problem(self) -> str | None:
        if self.dead:
            return self.dead
        if self.draining:
            return "the server is shutting down"
        if time.monotonic() - self.last_heartbeat > HEARTBEAT_TIMEOUT:
            return f"no heartbeat from the scheduler for {HEARTBEAT_TIMEOUT:.0f} s"
        return None

    def mark_dead(self, reason: str) -> None:
        if self.dead is None:
            self.dead = reason
            log.error("server unhealthy: %s", reason)
            self.fail_all(f"the inference engine is unavailable: {reason}")

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        self.ctx.destroy(linger=0)

    # --- the reader ----------------------------------------------------------------------------
    async def _read_loop(self) -> None:
        while True:
            frame = await self.inbox.recv()
            try:
                self._dispatch(self.decode(frame))
            except Exception:  # one malformed message must not stop every request
                log.exception("bad message")

    def _dispatch(self, msg: Message) -> None:
        match msg:
            case DetokenizedChunks(chunks=chunks):
                now = time.monotonic()
                for chunk in chunks:
                    self._on_output(chunk, now)
            case SchedulerStats():
                self._on_stats(msg)
            case RequestFailed(rid=rid):
                tracked = self.requests.pop(rid, None)
                if tracked is not None:
                    tracked.sink.put_nowait((tracked.index, msg))
            case IntegrityReport(id=cid, stats=stats):
                # fresher than the last heartbeat: keep /metrics consistent with the reply
                self.metrics.update_stats(SchedulerStats(stats, self.stats.gen_throughput))
                fut = self._replies.get(cid)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            case ChildFailed(who=who, message=message):
                self.mark_dead(f"{who} crashed: {message}")

    def _on_stats(self, stats: SchedulerStats) -> None:
        self.stats = stats
        self.last_heartbeat = time.monotonic()
        self.metrics.update_stats(stats)

    def _on_output(self, chunk: DetokenizedChunk, now: float) -> None:
        tracked = self.requests.get(chunk.rid)
        if tracked is None:
            return
        m = self.metrics
        if chunk.n_tokens:
            m.generation_tokens.inc(chunk.n_tokens)
            if tracked.last is None:
                m.ttft.observe(now - tracked.arrival)
            else:
                gap = (now - tracked.last) / chunk.n_tokens
                for _ in range(chunk.n_tokens):
                    m.itl.observe(gap)
            tracked.last = now
            tracked.tokens += chunk.n_tokens
        if chunk.finish_reason is not None:
            del self.requests[chunk.rid]
            m.inflight.set(len(self.requests))
            m.e2e.observe(now - tracked.arrival)
            m.prompt_tokens.inc(chunk.prompt_tokens)
            m.cached_tokens.inc(chunk.cached_tokens)
            m.num_requests.inc()
            m.finished.labels(model_name=m._labels["model_name"], finish_reason=chunk.finish_reason).inc()
        tracked.sink.put_nowait((tracked.index, chunk))

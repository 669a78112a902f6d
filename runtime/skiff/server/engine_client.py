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

from skiff.server import protocol as P
from skiff.server.metrics import ServerMetrics

log = logging.getLogger("skiff.api")

HEARTBEAT_TIMEOUT = 30.0  # seconds without a stats message before the scheduler counts as hung


@dataclass
class Delta:
    """One detokenized update of one engine request."""

    text: str
    n_tokens: int
    logprobs: list[list[Any]] | None  # [token, logprob, [[alt, logprob], ...]] per token
    finish_reason: str | None
    matched_stop: int | str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    error: str | None = None


@dataclass
class Failure:
    status: int
    message: str


@dataclass
class _Tracked:
    sink: asyncio.Queue[tuple[int, Delta | Failure]]
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
    page_size: int = 0
    total_pages: int = 0
    pids: dict[str, int] = field(default_factory=dict)  # child process ids by role (for operators and tests)
    rank_pids: list[int] = field(default_factory=list)  # the scheduler's own children (TP ranks 1..n-1)


class EngineClient:
    def __init__(self, endpoints: P.Endpoints, metrics: ServerMetrics) -> None:
        self.endpoints = endpoints
        self.metrics = metrics
        self.ctx = zmq.asyncio.Context()
        self.inbox = P.pull_socket(self.ctx, endpoints.api, bind=True)
        self.to_tokenizer = P.push_socket(self.ctx, endpoints.tokenizer, bind=True)
        self.to_scheduler: zmq.asyncio.Socket | None = None
        self.info = PodInfo()
        self.requests: dict[str, _Tracked] = {}
        self.stats: dict[str, Any] = {}
        self.last_heartbeat = 0.0
        self.dead: str | None = None  # why the pod can no longer serve
        self.draining = False
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count()
        self._reader: asyncio.Task[None] | None = None

    # --- startup -------------------------------------------------------------------------------
    async def wait_ready(self, expected: set[str], alive: Any, timeout: float) -> None:
        """Collect every child's `ready`; raise if one reports a fatal error, dies, or time runs out."""
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
            msg = P.unpack(await self.inbox.recv())
            if msg["t"] == "fatal":
                raise RuntimeError(f"{msg['who']} failed to start: {msg['message']}")
            if msg["t"] == P.READY:
                pending.discard(msg["who"])
                self._absorb_ready(msg)
                elapsed = timeout - (deadline - time.monotonic())
                detail = ""
                if msg["who"] == "scheduler":
                    detail = (
                        f": {msg.get('total_pages', 0)} KV pages of {msg.get('page_size', '?')} tokens, "
                        f"context {msg['max_context_len']}"
                    )
                print(f"  {msg['who']} ready after {elapsed:.1f} s{detail}", flush=True)
            elif msg["t"] == P.STATS:
                self._on_stats(msg["stats"])
        self.to_scheduler = P.push_socket(self.ctx, self.endpoints.scheduler)
        self.last_heartbeat = time.monotonic()

    def _absorb_ready(self, msg: dict[str, Any]) -> None:
        if msg["who"] == "scheduler":
            self.info.max_context_len = msg["max_context_len"]
            self.info.eos_token_ids = msg["eos_token_ids"]
            self.info.total_pages = msg.get("total_pages", 0)
            self.info.rank_pids = list(msg.get("rank_pids", []))
            self._on_stats(msg)
        elif msg["who"].startswith("tokenizer"):
            self.info.probe_ids = msg["probe_ids"]
            self.info.vocab_size = msg["vocab_size"]

    def start(self) -> None:
        self._reader = asyncio.get_running_loop().create_task(self._read_loop())

    # --- requests ------------------------------------------------------------------------------
    def submit(
        self,
        kind: str,
        prompt: Any,
        params: list[dict[str, Any]],
        detok: dict[str, Any],
        sink: asyncio.Queue[tuple[int, Delta | Failure]],
        first_index: int,
        rid_base: str,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[str]:
        """Send one prompt, fanned out to len(params) engine requests; their outputs land in `sink`."""
        now = time.monotonic()
        rids = [f"{rid_base}-{first_index + i}" for i in range(len(params))]
        for i, rid in enumerate(rids):
            self.requests[rid] = _Tracked(sink, first_index + i, now)
        msg: dict[str, Any] = {"t": P.GEN, "rids": rids, "kind": kind, "params": params, "detok": detok}
        if kind == "chat":
            msg["messages"] = prompt
            msg["template_kwargs"] = template_kwargs or {}
        else:
            msg["prompt"] = prompt
        self.to_tokenizer.send(P.pack(msg))
        self.metrics.inflight.set(len(self.requests))
        return rids

    def abort(self, rid: str) -> None:
        if self.requests.pop(rid, None) is not None and self.to_scheduler is not None and not self.dead:
            self.to_scheduler.send(P.pack({"t": P.ABORT, "rid": rid}))
        self.metrics.inflight.set(len(self.requests))

    async def control(self, cmd: str, timeout: float = 10.0) -> dict[str, Any]:
        assert self.to_scheduler is not None
        cid = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[cid] = fut
        self.to_scheduler.send(P.pack({"t": P.CTL, "id": cid, "cmd": cmd}))
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._replies.pop(cid, None)

    def fail_all(self, message: str, status: int = 503) -> None:
        for tracked in self.requests.values():
            tracked.sink.put_nowait((tracked.index, Failure(status, message)))
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
            msg = P.unpack(await self.inbox.recv())
            try:
                self._dispatch(msg)
            except Exception:  # one malformed message must not stop every request
                log.exception("bad message %r", msg.get("t"))

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind = msg["t"]
        if kind == P.OUT:
            now = time.monotonic()
            for row in msg["outs"]:
                self._on_output(row, now)
        elif kind == P.STATS:
            self._on_stats(msg["stats"])
        elif kind == P.ERR:
            tracked = self.requests.pop(msg["rid"], None)
            if tracked is not None:
                tracked.sink.put_nowait((tracked.index, Failure(msg["status"], msg["message"])))
        elif kind == P.CTL_REPLY:
            if msg.get("stats"):  # fresher than the last heartbeat: keep /metrics consistent with the reply
                self.metrics.update_stats({**self.stats, **msg["stats"]})
            fut = self._replies.get(msg["id"])
            if fut is not None and not fut.done():
                fut.set_result(msg)
        elif kind == "fatal":
            self.mark_dead(f"{msg['who']} crashed: {msg['message']}")

    def _on_stats(self, stats: dict[str, Any]) -> None:
        self.stats = stats
        self.last_heartbeat = time.monotonic()
        self.metrics.update_stats(stats)

    def _on_output(self, row: list[Any], now: float) -> None:
        rid = row[0]
        tracked = self.requests.get(rid)
        if tracked is None:
            return
        delta = Delta(*row[1:])
        m = self.metrics
        if delta.n_tokens:
            m.generation_tokens.inc(delta.n_tokens)
            if tracked.last is None:
                m.ttft.observe(now - tracked.arrival)
            else:
                gap = (now - tracked.last) / delta.n_tokens
                for _ in range(delta.n_tokens):
                    m.itl.observe(gap)
            tracked.last = now
            tracked.tokens += delta.n_tokens
        if delta.finish_reason is not None:
            del self.requests[rid]
            m.inflight.set(len(self.requests))
            m.e2e.observe(now - tracked.arrival)
            m.prompt_tokens.inc(delta.prompt_tokens)
            m.cached_tokens.inc(delta.cached_tokens)
            m.num_requests.inc()
            m.finished.labels(model_name=m._labels["model_name"], finish_reason=delta.finish_reason).inc()
        tracked.sink.put_nowait((tracked.index, delta))

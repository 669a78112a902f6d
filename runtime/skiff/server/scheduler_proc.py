"""The scheduler process: rank 0's `Engine` loop. Polls ZeroMQ, steps the engine, pushes token ids on.

The engine starts and owns its own TP follower processes; this loop only ever talks to rank 0.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import sys
import time
import traceback
from typing import Any

import zmq
from skiff_process.child import setup_child

from skiff.outputs import RequestTiming, StepOutput
from skiff.params import InvalidRequest
from skiff.server import protocol as P
from skiff.server.args import ServerArgs
from skiff.server.messages import (
    AbortRequest,
    ChildFailed,
    DecodeRegistration,
    EngineReady,
    IntegrityCheck,
    IntegrityReport,
    Message,
    RequestFailed,
    SchedulerStats,
    Shutdown,
    StepTokens,
    TokenizedRequest,
    ToScheduler,
)

log = logging.getLogger("skiff.scheduler")

STATS_INTERVAL = 0.5  # seconds; the stats message doubles as the scheduler's heartbeat
ABORT_MEMORY = 120.0  # seconds an abort for a not-yet-arrived request is remembered


def completion_budget(req: TokenizedRequest, limit: int) -> int:
    """The request's max_tokens, checked against the context; raises InvalidRequest."""
    n = len(req.input_ids)
    if not n:
        raise InvalidRequest("the prompt is empty")
    if n >= limit:
        raise InvalidRequest(
            f"This model's maximum context length is {limit} tokens. However, your prompt has "
            f"{n} tokens, which leaves no room for a completion."
        )
    if req.max_tokens is None:
        return limit - n
    if n + req.max_tokens > limit:
        raise InvalidRequest(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{n + req.max_tokens} tokens ({n} in the prompt, "
            f"{req.max_tokens} for the completion). Please reduce the prompt or max_tokens."
        )
    return req.max_tokens


class SchedulerLoop:
    def __init__(self, engine: Any, endpoints: P.Endpoints, ctx: zmq.Context) -> None:
        self.engine = engine
        self.inbox = P.Inbox(
            P.pull_socket(ctx, endpoints.scheduler, bind=True), P.Decoder("scheduler", ToScheduler)
        )
        self.to_detok = [P.outbox(ctx, addr) for addr in endpoints.detokenizer]
        self.to_api = P.ApiOutboxes(ctx, endpoints)
        self.live: dict[str, int] = {}  # rid -> the detokenizer that decodes it
        self._dealt = 0
        self.early_aborts: dict[str, float] = {}
        self.running = True
        self._tokens_since = 0
        self._last_stats = 0.0
        self._throughput = 0.0

    def ready(self) -> EngineReady:
        return EngineReady(
            max_context_len=int(self.engine.max_context_len),
            eos_token_ids=list(self.engine.eos_token_ids),
            rank_pids=[int(p.pid) for p in mp.active_children() if p.pid],
            stats=self.engine.stats(),
        )

    def run(self) -> None:
        while self.running:
            for msg in self.inbox.drain(0 if self.engine.has_work else 50):
                self.handle(msg)
            busy = self.engine.has_work
            if busy:
                self.send_outputs(self.engine.step(), self.engine.timings)
            now = time.monotonic()
            # going idle publishes at once, so /metrics never shows the pages of finished requests for long
            if now - self._last_stats >= STATS_INTERVAL or (busy and not self.engine.has_work):
                self.send_stats(now)

    def handle(self, msg: Message) -> None:
        match msg:
            case TokenizedRequest():
                self.add(msg)
            case AbortRequest(rid=rid):
                if rid in self.live:
                    self.engine.abort_request(rid)
                else:
                    self.early_aborts[rid] = time.monotonic()
            case IntegrityCheck(id=cid, owner=owner):
                self.to_api.to(owner).send(self.check_integrity(cid))
            case Shutdown():
                self.running = False

    def add(self, req: TokenizedRequest) -> None:
        if self.early_aborts.pop(req.rid, None) is not None:
            return
        try:
            budget = completion_budget(req, int(self.engine.max_context_len))
            sampling = dataclasses.replace(req.sampling, max_tokens=budget)
            detok = self._dealt % len(self.to_detok)
            self.engine.add_request(req.rid, req.input_ids, sampling, req.tokenized)
        except InvalidRequest as e:
            self.to_api.to(req.owner).send(RequestFailed(req.rid, 400, str(e)))
            return
        self._dealt += 1
        self.to_detok[detok].send(DecodeRegistration(req.rid, req.decode, req.owner))
        self.live[req.rid] = detok

    def send_outputs(self, outs: list[StepOutput], timings: list[RequestTiming]) -> None:
        if not outs:
            return
        live = self.live
        if len(self.to_detok) == 1:
            for o in outs:
                self._tokens_since += len(o.token_ids)
                if o.finish_reason is not None:
                    live.pop(o.rid, None)
            self.to_detok[0].send(StepTokens(outs, timings))
            return
        shards: list[list[StepOutput]] = [[] for _ in self.to_detok]
        timing_shards: list[list[RequestTiming]] = [[] for _ in self.to_detok]
        for t in timings:  # before the outputs below end their requests here
            timing_shards[live.get(t.rid, 0)].append(t)
        for o in outs:
            self._tokens_since += len(o.token_ids)
            detok = live.pop(o.rid, 0) if o.finish_reason is not None else live.get(o.rid, 0)
            shards[detok].append(o)
        for box, shard, shard_timings in zip(self.to_detok, shards, timing_shards, strict=True):
            if shard:
                box.send(StepTokens(shard, shard_timings))

    def send_stats(self, now: float) -> None:
        elapsed = now - self._last_stats if self._last_stats else STATS_INTERVAL
        rate = self._tokens_since / max(elapsed, 1e-6)
        self._throughput = rate if not self._last_stats else 0.5 * self._throughput + 0.5 * rate
        self._tokens_since = 0
        self._last_stats = now
        self.to_api.broadcast(SchedulerStats(self.engine.stats(), self._throughput))
        stale = [rid for rid, t in self.early_aborts.items() if now - t > ABORT_MEMORY]
        for rid in stale:
            del self.early_aborts[rid]

    def check_integrity(self, cid: int) -> IntegrityReport:
        ok, error = True, None
        try:
            self.engine.check_integrity()
        except AssertionError as e:
            ok, error = False, str(e) or "page accounting mismatch"
        return IntegrityReport(cid, ok, error, self.engine.stats(), len(self.live))


def _die(to_api: P.ApiOutboxes, e: Exception) -> None:
    """Report why, then exit: the API processes turn this into a failed start or an unhealthy pod."""
    traceback.print_exc()
    to_api.broadcast(ChildFailed("scheduler", f"{type(e).__name__}: {e}"))
    time.sleep(0.2)


def run_scheduler(args: ServerArgs, endpoints: P.Endpoints) -> None:
    setup_child("scheduler", args.log_level)
    ctx = zmq.Context()
    to_api = P.ApiOutboxes(ctx, endpoints)
    try:
        if args.engine.null_engine:
            from skiff.engine.null import NullEngine

            engine: Any = NullEngine(args.engine)
        else:
            from skiff.engine.engine import Engine

            engine = Engine(args.engine)
    except Exception as e:
        _die(to_api, e)
        sys.exit(1)
    loop = SchedulerLoop(engine, endpoints, ctx)
    to_api.send(loop.ready())
    try:
        loop.run()
    except Exception as e:
        _die(to_api, e)
        engine.shutdown()
        sys.exit(1)
    engine.shutdown()

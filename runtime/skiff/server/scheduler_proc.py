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

from skiff.params import InvalidRequest, SamplingParams
from skiff.server import protocol as P
from skiff.server.args import ServerArgs
from skiff.server.child import setup_child

log = logging.getLogger("skiff.scheduler")

STATS_INTERVAL = 0.5  # seconds; the stats message doubles as the scheduler's heartbeat
ABORT_MEMORY = 120.0  # seconds an abort for a not-yet-arrived request is remembered
_PARAM_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}


def _stats_dict(engine: Any) -> dict[str, Any]:
    stats = engine.stats()
    return dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else dict(vars(stats))


class SchedulerLoop:
    def __init__(self, engine: Any, endpoints: P.Endpoints, ctx: zmq.Context) -> None:
        self.engine = engine
        self.inbox = P.pull_socket(ctx, endpoints.scheduler, bind=True)
        self.to_detok = P.push_socket(ctx, endpoints.detokenizer)
        self.to_api = P.push_socket(ctx, endpoints.api)
        self.live: set[str] = set()
        self.early_aborts: dict[str, float] = {}
        self.running = True
        self._tokens_since = 0
        self._last_stats = 0.0
        self._throughput = 0.0

    def ready_info(self) -> dict[str, Any]:
        info = {
            "max_context_len": int(self.engine.max_context_len),
            "eos_token_ids": list(self.engine.eos_token_ids),
            # the engine's TP ranks: the API process ends them if this process dies without doing so
            "rank_pids": [int(p.pid) for p in mp.active_children() if p.pid],
        }
        info.update(_stats_dict(self.engine))
        return info

    def run(self) -> None:
        while self.running:
            for msg in P.drain(self.inbox, 0 if self.engine.has_work else 50):
                self.handle(msg)
            busy = self.engine.has_work
            if busy:
                self.send_outputs(self.engine.step())
            now = time.monotonic()
            # going idle publishes at once, so /metrics never shows the pages of finished requests for long
            if now - self._last_stats >= STATS_INTERVAL or (busy and not self.engine.has_work):
                self.send_stats(now)

    def handle(self, msg: dict[str, Any]) -> None:
        kind = msg["t"]
        if kind == P.ADD:
            self.add(msg)
        elif kind == P.ABORT:
            rid = msg["rid"]
            if rid in self.live:
                self.engine.abort_request(rid)
            else:
                self.early_aborts[rid] = time.monotonic()
        elif kind == P.CTL:
            self.control(msg)
        elif kind == P.SHUTDOWN:
            self.running = False

    def add(self, msg: dict[str, Any]) -> None:
        rid = msg["rid"]
        if self.early_aborts.pop(rid, None) is not None:
            return
        ids: list[int] = msg["ids"]
        params = dict(msg["params"])
        limit = int(self.engine.max_context_len)
        try:
            if not ids:
                raise InvalidRequest("the prompt is empty")
            if len(ids) >= limit:
                raise InvalidRequest(
                    f"This model's maximum context length is {limit} tokens. However, your prompt has "
                    f"{len(ids)} tokens, which leaves no room for a completion."
                )
            if params.get("max_tokens") is None:
                params["max_tokens"] = limit - len(ids)
            elif len(ids) + params["max_tokens"] > limit:
                raise InvalidRequest(
                    f"This model's maximum context length is {limit} tokens. However, you requested "
                    f"{len(ids) + params['max_tokens']} tokens ({len(ids)} in the prompt, "
                    f"{params['max_tokens']} for the completion). Please reduce the prompt or max_tokens."
                )
            sp = SamplingParams(**{k: v for k, v in params.items() if k in _PARAM_FIELDS and k != "stop"})
            self.to_detok.send(P.pack({"t": P.REG, "rid": rid, **msg["detok"]}))
            self.engine.add_request(rid, ids, sp)
        except InvalidRequest as e:
            self.to_api.send(P.pack({"t": P.ERR, "rid": rid, "status": 400, "message": str(e)}))
            return
        self.live.add(rid)

    def send_outputs(self, outs: list[Any]) -> None:
        if not outs:
            return
        rows = []
        for o in outs:
            self._tokens_since += len(o.token_ids)
            if o.finish_reason is not None:
                self.live.discard(o.rid)
            rows.append(
                [
                    o.rid,
                    list(o.token_ids),
                    o.logprobs,
                    o.top_logprobs,
                    o.finish_reason,
                    o.matched_stop,
                    o.prompt_tokens,
                    o.cached_tokens,
                    o.completion_tokens,
                    o.error,
                ]
            )
        self.to_detok.send(P.pack({"t": P.OUT, "outs": rows}))

    def send_stats(self, now: float) -> None:
        elapsed = now - self._last_stats if self._last_stats else STATS_INTERVAL
        rate = self._tokens_since / max(elapsed, 1e-6)
        self._throughput = rate if not self._last_stats else 0.5 * self._throughput + 0.5 * rate
        self._tokens_since = 0
        self._last_stats = now
        stats = _stats_dict(self.engine)
        stats["gen_throughput"] = self._throughput
        self.to_api.send(P.pack({"t": P.STATS, "stats": stats}))
        stale = [rid for rid, t in self.early_aborts.items() if now - t > ABORT_MEMORY]
        for rid in stale:
            del self.early_aborts[rid]

    def control(self, msg: dict[str, Any]) -> None:
        reply: dict[str, Any] = {"t": P.CTL_REPLY, "id": msg["id"]}
        if msg["cmd"] == "check_integrity":
            try:
                self.engine.check_integrity()
                reply["ok"] = True
            except AssertionError as e:
                reply.update(ok=False, error=str(e) or "page accounting mismatch")
            reply["stats"] = _stats_dict(self.engine)
            reply["live"] = len(self.live)
        else:
            reply.update(ok=False, error=f"unknown control command {msg['cmd']!r}")
        self.to_api.send(P.pack(reply))


def run_scheduler(args: ServerArgs, endpoints: P.Endpoints) -> None:
    setup_child("scheduler", args.log_level)
    ctx = zmq.Context()
    to_api = P.push_socket(ctx, endpoints.api)
    try:
        from skiff.engine.engine import Engine

        engine = Engine(args.engine)
    except Exception as e:  # report why, then die: the API process turns this into a failed start
        traceback.print_exc()
        to_api.send(P.pack({"t": "fatal", "who": "scheduler", "message": f"{type(e).__name__}: {e}"}))
        time.sleep(0.2)
        sys.exit(1)
    loop = SchedulerLoop(engine, endpoints, ctx)
    to_api.send(P.pack({"t": P.READY, "who": "scheduler", **loop.ready_info()}))
    try:
        loop.run()
    except Exception as e:
        traceback.print_exc()
        to_api.send(P.pack({"t": "fatal", "who": "scheduler", "message": f"{type(e).__name__}: {e}"}))
        time.sleep(0.2)
        engine.shutdown()
        sys.exit(1)
    engine.shutdown()

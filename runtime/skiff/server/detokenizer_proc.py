"""Detokenizer process: token ids -> text deltas, stop strings, logprob token strings.

A stop string ends a request here (the engine never sees text): the detokenizer reports
finish_reason "stop" to the API and sends the scheduler an abort so the request's pages are freed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import zmq

from skiff.server import protocol as P
from skiff.server.args import ServerArgs
from skiff.server.child import setup_child
from skiff.server.incremental import IncrementalDecoder, StopMatcher
from skiff.tokenizer import load_tokenizer

log = logging.getLogger("skiff.detokenizer")


class RequestDecodeState:
    def __init__(self, tok: Any, reg: dict[str, Any], piece: Any) -> None:
        skip = bool(reg.get("skip_special_tokens", True))
        fast = getattr(tok, "_tokenizer", None)  # the Rust tokenizer: no Python-side overhead per call
        if fast is not None:

            def decode(ids: Sequence[int]) -> str:
                return fast.decode(list(ids), skip_special_tokens=skip)
        else:

            def decode(ids: Sequence[int]) -> str:
                return tok.decode(list(ids), skip_special_tokens=skip)

        self.decoder = IncrementalDecoder(decode)
        self.stop = StopMatcher(reg.get("stop") or [])
        self.want_logprobs = bool(reg.get("logprobs"))
        self.piece = piece
        self.n_tokens = 0

    def step(self, row: list[Any]) -> list[Any]:
        rid, token_ids, logprobs, top, finish, matched, prompt_tokens, cached, completion, error = row
        text_ids = token_ids
        if finish == "stop" and isinstance(matched, int) and token_ids and token_ids[-1] == matched:
            text_ids = token_ids[:-1]  # a stop token is not part of the text (EOS would be skipped anyway)
        self.n_tokens += len(token_ids)
        final = finish is not None
        delta = self.decoder.push(text_ids)
        if final:
            delta += self.decoder.flush()
        text = self.stop.feed(delta, final=final)
        if self.stop.matched is not None:
            finish, matched, completion = "stop", self.stop.matched, self.n_tokens
        lp = None
        if self.want_logprobs and logprobs is not None:
            lp = []
            for i, (tid, value) in enumerate(zip(token_ids, logprobs, strict=False)):
                alts = top[i] if top and i < len(top) else {}
                lp.append([self.piece(tid), value, [[self.piece(a), v] for a, v in alts.items()]])
        return [rid, text, len(token_ids), lp, finish, matched, prompt_tokens, cached, completion, error]


def run_detokenizer(args: ServerArgs, endpoints: P.Endpoints) -> None:
    setup_child("detokenizer", args.log_level)
    tok = load_tokenizer(args.tokenizer_path)
    pieces: dict[int, str] = {}

    def piece(tid: int) -> str:
        s = pieces.get(tid)
        if s is None:
            s = pieces[tid] = tok.decode([tid])
        return s

    ctx = zmq.Context()
    inbox = P.pull_socket(ctx, endpoints.detokenizer, bind=True)
    to_api = P.push_socket(ctx, endpoints.api)
    to_sched = P.push_socket(ctx, endpoints.scheduler)
    to_api.send(P.pack({"t": P.READY, "who": "detokenizer"}))
    states: dict[str, RequestDecodeState] = {}
    while True:
        batch: list[list[Any]] = []
        for msg in P.drain(inbox, 100):
            kind = msg["t"]
            if kind == P.REG:
                states[msg["rid"]] = RequestDecodeState(tok, msg, piece)
            elif kind == P.OUT:
                for row in msg["outs"]:
                    st = states.get(row[0])
                    if st is None:  # already finished here (stop string): the engine's abort echo
                        continue
                    out = st.step(row)
                    if out[4] is not None:
                        del states[row[0]]
                        if st.stop.matched is not None and row[4] is None:
                            to_sched.send(P.pack({"t": P.ABORT, "rid": row[0]}))
                    batch.append(out)
            elif kind == P.SHUTDOWN:
                return
        if batch:
            to_api.send(P.pack({"t": P.OUT, "outs": batch}))

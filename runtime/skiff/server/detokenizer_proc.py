"""Detokenizer process: token ids -> text deltas, stop strings, logprob token strings.

A stop string ends a request here (the engine never sees text): the detokenizer reports
finish_reason "stop" to the API and sends the scheduler an abort so the request's pages are freed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import zmq
from skiff_process.child import setup_child

from skiff.outputs import RequestTiming, StepOutput
from skiff.server import protocol as P
from skiff.server.args import ServerArgs
from skiff.server.incremental import IncrementalDecoder, StopMatcher
from skiff.server.messages import (
    AbortRequest,
    DecodeOptions,
    DecodeRegistration,
    DetokenizedChunk,
    DetokenizedChunks,
    DetokenizerReady,
    Shutdown,
    StepTokens,
    ToDetokenizer,
    TokenLogprob,
)
from skiff.tokenizer import load_tokenizer

log = logging.getLogger("skiff.detokenizer")


class RequestDecodeState:
    def __init__(self, tok: Any, options: DecodeOptions, piece: Callable[[int], str]) -> None:
        skip = options.skip_special_tokens
        fast = getattr(tok, "_tokenizer", None)  # the Rust tokenizer: no Python-side overhead per call
        if fast is not None:

            def decode(ids: Sequence[int]) -> str:
                return fast.decode(list(ids), skip_special_tokens=skip)
        else:

            def decode(ids: Sequence[int]) -> str:
                return tok.decode(list(ids), skip_special_tokens=skip)

        self.decoder = IncrementalDecoder(decode)
        self.stop = StopMatcher(options.stop)
        self.want_logprobs = options.logprobs
        self.piece = piece
        self.n_tokens = 0

    def step(self, out: StepOutput, timing: RequestTiming | None = None) -> DetokenizedChunk:
        token_ids, finish, matched = out.token_ids, out.finish_reason, out.matched_stop
        completion = out.completion_tokens
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
        return DetokenizedChunk(
            out.rid,
            text,
            len(token_ids),
            self.token_logprobs(out),
            finish,
            matched,
            out.prompt_tokens,
            out.cached_tokens,
            completion,
            out.error,
            timing,
        )

    def token_logprobs(self, out: StepOutput) -> list[TokenLogprob] | None:
        if not self.want_logprobs or out.logprobs is None:
            return None
        top = out.top_logprobs
        entries = []
        for i, (tid, value) in enumerate(zip(out.token_ids, out.logprobs, strict=False)):
            alts = top[i] if top and i < len(top) else {}
            entries.append(
                TokenLogprob(self.piece(tid), value, [(self.piece(a), v) for a, v in alts.items()])
            )
        return entries


def run_detokenizer(args: ServerArgs, endpoints: P.Endpoints, index: int = 0) -> None:
    name = "detokenizer" if len(endpoints.detokenizer) == 1 else f"detokenizer-{index}"
    setup_child(name, args.log_level)
    tok = load_tokenizer(args.tokenizer_path)
    pieces: dict[int, str] = {}

    def piece(tid: int) -> str:
        s = pieces.get(tid)
        if s is None:
            s = pieces[tid] = tok.decode([tid])
        return s

    ctx = zmq.Context()
    inbox = P.Inbox(
        P.pull_socket(ctx, endpoints.detokenizer[index], bind=True), P.Decoder(name, ToDetokenizer)
    )
    to_api = P.ApiOutboxes(ctx, endpoints)
    to_sched = P.outbox(ctx, endpoints.scheduler)
    to_api.send(DetokenizerReady(name))
    states: dict[str, tuple[RequestDecodeState, int]] = {}  # rid -> its decoder and its API worker
    while True:
        batches: dict[int, list[DetokenizedChunk]] = {}  # one message per API worker and pass
        for msg in inbox.drain(100):
            match msg:
                case DecodeRegistration(rid=rid, options=options, owner=owner):
                    states[rid] = (RequestDecodeState(tok, options, piece), owner)
                case StepTokens(outputs=outputs, timings=timings):
                    first = {t.rid: t for t in timings} if timings else None
                    for out in outputs:
                        known = states.get(out.rid)
                        if known is None:  # already finished here (stop string): the engine's abort echo
                            continue
                        st, owner = known
                        chunk = st.step(out, first.get(out.rid) if first else None)
                        if chunk.finish_reason is not None:
                            del states[out.rid]
                            if st.stop.matched is not None and out.finish_reason is None:
                                to_sched.send(AbortRequest(out.rid))
                        batch = batches.get(owner)
                        if batch is None:
                            batch = batches[owner] = []
                        batch.append(chunk)
                case Shutdown():
                    return
        for owner, batch in batches.items():
            to_api.to(owner).send(DetokenizedChunks(batch))

"""An engine without a model, for measuring the serving layer: a step costs nothing.

It keeps the Engine's interface and request rules (engine/request_rules.py). Each step gives every running
request its next token, cycling through the request's own prompt ids, so the detokenizer and the API server
handle real text.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, fields

from skiff.config import EngineConfig
from skiff.engine.loading import checkpoint_dir, eos_token_ids
from skiff.engine.request_rules import check_prompt, context_limit, finish_reason
from skiff.engine.stats import EngineStats
from skiff.loader import read_config
from skiff.models import ModelConfig
from skiff.outputs import RequestTiming, StepOutput
from skiff.params import SamplingParams


@dataclass
class Stream:
    rid: str
    prompt: list[int]
    params: SamplingParams
    queued: int  # epoch ns
    scheduled: int = 0
    produced: int = 0

    def next_token(self) -> int:
        token = self.prompt[self.produced % len(self.prompt)]
        self.produced += 1
        return token


class NullEngine:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.model_path, weights = checkpoint_dir(cfg)
        self.model_config = ModelConfig.from_hf(read_config(weights))
        self.eos_token_ids = eos_token_ids(self.model_config, weights)
        self.max_context_len = context_limit(cfg, self.model_config)
        self.waiting: deque[Stream] = deque()
        self.running: dict[str, Stream] = {}
        self._finished: list[StepOutput] = []
        self.timings: list[RequestTiming] = []  # of the requests whose first token the last step() gave
        self.prompt_tokens = self.generation_tokens = 0
        self.closed = False

    def add_request(self, rid: str, input_ids: list[int], params: SamplingParams, queued: int = 0) -> None:
        check_prompt(input_ids, self.max_context_len, self.model_config.vocab_size, self.max_context_len + 1)
        params.validate()
        self.waiting.append(Stream(rid, list(input_ids), params, queued or time.time_ns()))

    def abort_request(self, rid: str) -> None:
        s = self.running.pop(rid, None)
        if s is None:
            s = next((w for w in self.waiting if w.rid == rid), None)
            if s is None:
                return
            self.waiting.remove(s)
        self._finished.append(StepOutput(s.rid, [], None, None, "abort", None, len(s.prompt), 0, s.produced))

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._finished)

    def step(self) -> list[StepOutput]:
        outputs, self._finished = self._finished, []
        if self.timings:
            self.timings = []
        while self.waiting and len(self.running) < self.cfg.max_running_requests:
            s = self.waiting.popleft()
            s.scheduled = time.time_ns()
            self.running[s.rid] = s
            self.prompt_tokens += len(s.prompt)
        done = []
        for s in self.running.values():
            token = s.next_token()
            if s.produced == 1:
                self.timings.append(RequestTiming(s.rid, s.queued, s.scheduled, time.time_ns()))
            reason = finish_reason(
                s.params, token, self.eos_token_ids, len(s.prompt), s.produced, self.max_context_len
            )
            p = s.params
            lp = [0.0] if p.logprobs else None
            top = [{token: 0.0}] if p.top_logprobs else None
            matched = token if reason == "stop" else None
            outputs.append(StepOutput(s.rid, [token], lp, top, reason, matched, len(s.prompt), 0, s.produced))
            if reason is not None:
                done.append(s.rid)
        self.generation_tokens += len(self.running)  # one token each (aborts in outputs carry none)
        for rid in done:
            del self.running[rid]
        return outputs

    def stats(self) -> EngineStats:
        now = {
            "num_running": len(self.running),
            "num_queued": len(self.waiting),
            "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens,
            "page_size": self.cfg.page_size,
        }
        return EngineStats(**{f.name: now.get(f.name, 0) for f in fields(EngineStats)})  # no pages: zeros

    def check_integrity(self) -> None:
        """No pages to account for."""

    def shutdown(self, timeout: float = 10.0) -> None:
        self.closed = True

"""skiff.LLM: the offline API over one in-process Engine."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from skiff.config import EngineConfig
from skiff.engine.engine import Engine
from skiff.outputs import RequestOutput
from skiff.params import InvalidRequest, SamplingParams
from skiff.tokenizer import load_tokenizer


class LLM:
    def __init__(self, model: str | None = None, tokenizer: str | None = None, **kwargs: Any) -> None:
        self.config = EngineConfig(model=model, tokenizer=tokenizer, **kwargs)
        self.engine = Engine(self.config)
        self.tokenizer = load_tokenizer(tokenizer or self.engine.model_path)
        self._ids = itertools.count()

    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt, add_special_tokens=True))
        return list(prompt)

    def generate(
        self,
        prompts: str | list[int] | Sequence[str | list[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        if params is None:
            params = SamplingParams()
        plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise InvalidRequest(f"{len(prompts)} prompts but {len(plist)} sampling parameter sets")
        results: dict[str, RequestOutput] = {}
        order: list[str] = []
        texts: dict[str, str] = {}  # final text of requests that a stop string ended
        try:
            for prompt, p in zip(prompts, plist, strict=True):
                rid = f"offline-{next(self._ids)}"
                ids = self.encode(prompt)
                self.engine.add_request(rid, ids, p)
                order.append(rid)
                results[rid] = RequestOutput(
                    rid, ids, logprobs=[] if p.logprobs else None, top_logprobs=[] if p.top_logprobs else None
                )
            pmap = dict(zip(order, plist, strict=True))
            while self.engine.has_work:
                for out in self.engine.step():
                    res = results[out.rid]
                    if out.rid in texts:
                        continue  # the abort that follows a stop-string match
                    res.token_ids.extend(out.token_ids)
                    res.cached_tokens = out.cached_tokens
                    if out.logprobs is not None and res.logprobs is not None:
                        res.logprobs.extend(out.logprobs)
                    if out.top_logprobs is not None and res.top_logprobs is not None:
                        res.top_logprobs.extend(out.top_logprobs)
                    if out.finished:
                        res.finish_reason = out.finish_reason
                    elif pmap[out.rid].stop and self._hit_stop(res, pmap[out.rid], texts):
                        self.engine.abort_request(out.rid)
                        res.finish_reason = "stop"
        except BaseException:
            for rid in order:
                self.engine.abort_request(rid)
            self.engine.step()
            raise
        for res in results.values():
            res.text = (
                texts[res.rid]
                if res.rid in texts
                else self.tokenizer.decode(res.token_ids, skip_special_tokens=True)
            )
        return [results[rid] for rid in order]

    def _hit_stop(self, res: RequestOutput, p: SamplingParams, texts: dict[str, str]) -> bool:
        text = self.tokenizer.decode(res.token_ids, skip_special_tokens=p.skip_special_tokens)
        hits = [i for i in (text.find(s) for s in p.stop) if i >= 0]
        if not hits:
            return False
        texts[res.rid] = text[: min(hits)]
        return True

    def prefill_logits(self, token_ids: list[int]) -> torch.Tensor:
        return self.engine.prefill_logits(token_ids)

    def shutdown(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

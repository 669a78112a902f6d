"""One HTTP generation request: fan out prompts x n into engine requests, then stream or collect choices."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from skiff.params import SamplingParams
from skiff.server.chat_output import AnswerShaper, ChatOutputSpec, Piece, tool_call_body
from skiff.server.engine_client import EngineClient
from skiff.server.errors import ApiError, error_body
from skiff.server.messages import DecodeOptions, DetokenizedChunk, Prompt, RequestFailed, TokenLogprob
from skiff.server.tracing import current_trace

# UTF-8 as is, like json.dumps(ensure_ascii=False), and several times faster
_json = msgspec.json.Encoder().encode


@dataclass
class ChoiceState:
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


class Job:
    def __init__(
        self,
        client: EngineClient,
        chat: bool,
        model: str,
        prompts: list[Prompt],
        sampling: SamplingParams,
        max_tokens: int | None,
        n: int,
        decode: DecodeOptions,
        request_id: str | None = None,
        output: ChatOutputSpec | None = None,
    ) -> None:
        self.client, self.chat, self.model, self.n = client, chat, model, n
        self.output = output or ChatOutputSpec()
        prefix = "chatcmpl-" if chat else "cmpl-"
        self.id = request_id or prefix + uuid.uuid4().hex
        self.created = int(time.time())
        self.sink: asyncio.Queue[tuple[int, DetokenizedChunk | RequestFailed]] = asyncio.Queue()
        self.choices = [ChoiceState() for _ in range(len(prompts) * n)]
        self.rids: list[str] = []
        self._open = len(self.choices)
        rid_base = uuid.uuid4().hex
        seed = sampling.seed
        per_choice = [
            sampling if seed is None else dataclasses.replace(sampling, seed=seed + i) for i in range(n)
        ]
        self.trace = current_trace()
        if self.trace is not None:
            self.trace.submitted(len(self.choices), model, self.id)
        for p_index, prompt in enumerate(prompts):
            self.rids += client.submit(
                prompt, per_choice, max_tokens, decode, self.sink, p_index * n, rid_base
            )

    def abort(self) -> None:
        for rid in self.rids:
            self.client.abort(rid)

    async def events(self) -> AsyncIterator[tuple[int, DetokenizedChunk]]:
        """(choice index, chunk) until every choice has finished; a RequestFailed raises ApiError.

        What arrived while the consumer was busy comes as one chunk per choice: a slow client gets fewer,
        larger SSE events instead of falling further behind."""
        try:
            while self._open:
                arrived = [await self.sink.get()]
                while not self.sink.empty():
                    arrived.append(self.sink.get_nowait())
                merged: dict[int, DetokenizedChunk] = {}
                for index, item in arrived:
                    if isinstance(item, RequestFailed):
                        raise ApiError(
                            item.status, item.message, code="engine_error" if item.status >= 500 else None
                        )
                    if item.error:
                        raise ApiError(500, f"generation failed: {item.error}", code="engine_error")
                    earlier = merged.get(index)
                    merged[index] = item if earlier is None else earlier.then(item)
                for index, item in merged.items():
                    if self.trace is not None:
                        self.trace.observe(index, item)
                    c = self.choices[index]
                    c.text.append(item.text)
                    if item.logprobs:
                        c.logprobs.extend(item.logprobs)
                    c.prompt_tokens, c.cached_tokens = item.prompt_tokens, item.cached_tokens
                    c.completion_tokens = item.completion_tokens
                    if item.finish_reason is not None:
                        c.finish_reason, c.matched_stop = item.finish_reason, item.matched_stop
                        self._open -= 1
                    yield index, item
        finally:
            if self._open:  # disconnect, failure or cancellation: free what is still running
                self.abort()

    def usage(self) -> dict[str, Any]:
        # the prompt is counted once per prompt, not once per choice (as OpenAI does for n > 1)
        prompt = sum(self.choices[i].prompt_tokens for i in range(0, len(self.choices), self.n))
        cached = sum(self.choices[i].cached_tokens for i in range(0, len(self.choices), self.n))
        completion = sum(c.completion_tokens for c in self.choices)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    # --- response bodies -----------------------------------------------------------------------
    def _logprobs(self, entries: list[TokenLogprob], offset: int) -> dict[str, Any] | None:
        if not entries:
            return None
        if self.chat:
            return {
                "content": [
                    {
                        "token": e.token,
                        "logprob": e.logprob,
                        "bytes": list(e.token.encode()),
                        "top_logprobs": [
                            {"token": a, "logprob": v, "bytes": list(a.encode())} for a, v in e.top
                        ],
                    }
                    for e in entries
                ]
            }
        offsets, pos = [], offset
        for e in entries:
            offsets.append(pos)
            pos += len(e.token)
        return {
            "tokens": [e.token for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [dict(e.top) for e in entries],
            "text_offset": offsets,
        }

    def final_body(self) -> dict[str, Any]:
        choices = []
        for i, c in enumerate(self.choices):
            text = "".join(c.text)
            choice: dict[str, Any] = {
                "index": i,
                "finish_reason": c.finish_reason,
                "logprobs": self._logprobs(c.logprobs, 0),
                "matched_stop": c.matched_stop,
            }
            if self.chat:
                shaper = AnswerShaper(self.output)
                answer = shaper.feed(text).then(shaper.finish())
                choice["message"] = self._message(answer)
                choice["finish_reason"] = self._finish(c.finish_reason, bool(answer.calls))
            else:
                choice["text"] = text
            choices.append(choice)
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
        }

    def _message(self, answer: Piece) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": answer.content or None}
        if not answer.calls and msg["content"] is None:
            msg["content"] = ""
        if self.output.reasoning_parser:
            msg["reasoning_content"] = answer.reasoning or None
        if answer.calls:
            msg["tool_calls"] = [tool_call_body(c) for c in answer.calls]
        return msg

    @staticmethod
    def _finish(reason: str | None, made_calls: bool) -> str | None:
        return "tool_calls" if made_calls and reason == "stop" else reason

    async def collect(self) -> dict[str, Any]:
        async for _ in self.events():
            pass
        return self.final_body()

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = usage
        return b"data: " + _json(body) + b"\n\n"

    async def stream(self, include_usage: bool) -> AsyncIterator[bytes]:
        offsets = [0] * len(self.choices)
        shapers = [AnswerShaper(self.output) for _ in self.choices] if self.chat else []
        made_calls = [False] * len(self.choices)
        try:
            if self.chat:
                yield self._chunk(
                    [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                        for i in range(len(self.choices))
                    ]
                )
            async for index, d in self.events():
                if not d.text and not d.logprobs and d.finish_reason is None:
                    continue
                choice: dict[str, Any] = {
                    "index": index,
                    "logprobs": self._logprobs(d.logprobs or [], offsets[index]),
                    "finish_reason": d.finish_reason,
                }
                offsets[index] += len(d.text)
                if d.finish_reason is not None:
                    choice["matched_stop"] = d.matched_stop
                if self.chat:
                    piece = shapers[index].feed(d.text)
                    if d.finish_reason is not None:
                        piece = piece.then(shapers[index].finish())
                    made_calls[index] = made_calls[index] or bool(piece.calls)
                    choice["delta"] = piece.delta()
                    if d.finish_reason is not None:
                        choice["finish_reason"] = self._finish(d.finish_reason, made_calls[index])
                    elif not choice["delta"] and not d.logprobs:
                        continue  # all of it held back (a possible tag or call)
                else:
                    choice["text"] = d.text
                yield self._chunk([choice])
            if include_usage:
                yield self._chunk([], self.usage())
            yield b"data: [DONE]\n\n"
        except ApiError as e:  # the stream has started: report in-band, then end it
            yield b"data: " + _json(error_body(e.status, e.message, e.param, e.code)) + b"\n\n"

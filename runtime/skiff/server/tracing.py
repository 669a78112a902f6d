"""Request spans of the API server, with `--otlp-traces-endpoint` (skiff_contract.tracing): one SERVER span
per generation request, a child of the caller's W3C `traceparent`, and per choice these child spans, all
cut at wall-clock times (the other processes' stamps, `outputs.RequestTiming`, come once, in the choice's
first chunk; the pod's processes share one clock):

    tokenize    this worker submitted the prompt -> a tokenizer finished it (the hop, any wait for a
                tokenizer busy with other prompts, and the chat template and encoding)
    queue       tokenized -> first put in a batch: the hop to the scheduler, any engine step it runs
                meanwhile, and the wait for a running slot or KV pages
    prefill     first put in a batch -> its first token sampled (all chunks of a chunked prefill)
    detokenize  first token sampled -> its text reached this worker: the hop to the detokenizer, its pass
                over that step, and the hop back (every later token takes the same way, inside decode)
    decode      first token sampled -> the last chunk reached this worker (so it ends with the last
                token's own way through the detokenizer)

Times are clamped to run forward, so a clock step never gives a span that ends before it starts. A choice
that ended without a token has no child spans. The first token's arrival is also an event on the request
span."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from skiff_contract.tracing import Tracing

from skiff.outputs import RequestTiming
from skiff.server.messages import DetokenizedChunk

TRACED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass
class _Choice:
    submitted: int  # epoch ns, like every time here
    timing: RequestTiming | None = None  # the engine's milestones
    first_token: int | None = None  # ... and when this worker got the first and the last chunk
    finished: int | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    def phases(self) -> list[tuple[str, int, int, dict[str, Any]]]:
        """(name, start, end, attributes) of the choice's child spans, times clamped to run forward."""
        t = self.timing
        if t is None or self.first_token is None:
            return []
        queued = max(t.queued, self.submitted)
        scheduled = max(t.scheduled, queued)
        sampled = max(t.first_token, scheduled)
        prompt = {"gen_ai.usage.input_tokens": self.prompt_tokens, "skiff.cached_tokens": self.cached_tokens}
        out = [
            ("tokenize", self.submitted, queued, {}),
            ("queue", queued, scheduled, {}),
            ("prefill", scheduled, sampled, prompt),
            ("detokenize", sampled, max(self.first_token, sampled), {}),
        ]
        if self.finished is not None:
            output = {"gen_ai.usage.output_tokens": self.completion_tokens}
            output["gen_ai.response.finish_reason"] = self.finish_reason or ""
            out.append(("decode", sampled, max(self.finished, sampled), output))
        return out


@dataclass
class RequestTrace:
    tracing: Tracing
    span: Any
    choices: dict[int, _Choice] = field(default_factory=dict)
    ended: bool = False

    def submitted(self, count: int, model: str, request_id: str) -> None:
        now = time.time_ns()
        self.choices = {i: _Choice(now) for i in range(count)}
        self.span.set_attributes({"gen_ai.request.model": model, "skiff.request_id": request_id})

    def observe(self, index: int, chunk: DetokenizedChunk) -> None:
        choice = self.choices.get(index)
        if choice is None:
            return
        now = time.time_ns()
        if chunk.timing is not None:
            choice.timing = chunk.timing
        choice.prompt_tokens, choice.cached_tokens = chunk.prompt_tokens, chunk.cached_tokens
        if chunk.n_tokens and choice.first_token is None:
            choice.first_token = now
            if index == 0:
                self.span.add_event("first_token", timestamp=now)
        if chunk.finish_reason is not None:
            choice.finished, choice.finish_reason = now, chunk.finish_reason
            choice.completion_tokens = chunk.completion_tokens
            self.span.set_attributes(
                {"gen_ai.usage.input_tokens": chunk.prompt_tokens, "skiff.cached_tokens": chunk.cached_tokens}
            )

    def end(self, status: int, end_ns: int | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        for index, c in self.choices.items():
            for name, start, stop, attrs in c.phases():
                attrs = {"skiff.choice": index, **attrs}
                self.tracing.start(name, self.span, start_time=start, attributes=attrs).end(end_time=stop)
        total = sum(c.completion_tokens for c in self.choices.values())
        self.span.set_attributes({"http.response.status_code": status, "gen_ai.usage.output_tokens": total})
        self.span.end(end_time=end_ns)


_current: ContextVar[RequestTrace | None] = ContextVar("skiff_request_trace", default=None)


def current_trace() -> RequestTrace | None:
    """The trace of the request being handled, or None when tracing is off or the path is not traced."""
    return _current.get()


class TraceMiddleware:
    """ASGI middleware: a span per request to TRACED_PATHS, ended when the last body byte is sent."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], tracing: Tracing) -> None:
        self.app, self.tracing = app, tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in TRACED_PATHS:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        name = f"{scope['method']} {scope['path']}"
        attrs = {
            "http.request.method": scope["method"],
            "http.route": scope["path"],
            "gen_ai.system": "skiff",
        }
        span = self.tracing.start(name, self.tracing.extract(headers), kind="server", attributes=attrs)
        trace = RequestTrace(self.tracing, span)
        token = _current.set(trace)
        status = 500

        async def traced_send(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            last = message["type"] == "http.response.body" and not message.get("more_body", False)
            sent = time.time_ns()  # before the last byte leaves: the caller's span ends after ours
            await send(message)
            if last:
                trace.end(status, sent)

        try:
            await self.app(scope, receive, traced_send)
        except Exception as e:
            span.record_exception(e)
            raise
        finally:
            _current.reset(token)
            trace.end(status)

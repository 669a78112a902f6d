"""Request spans of the API server, with `--otlp-traces-endpoint` (skiff_contract.tracing): one SERVER span
per generation request, a child of the caller's W3C `traceparent`, and per choice two child spans.

The engine runs in other processes and its messages carry no per-request timing, so the child spans are
cut at what this process sees of each choice: `queue_and_prefill` from submission to the first token
(tokenizing, waiting in the scheduler's queue and the prefill) and `decode` from the first token to the
last (the detokenizer works alongside, chunk by chunk, so its time is inside). The first token is also an
event on the request span."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from skiff_contract.tracing import Tracing

from skiff.server.messages import DetokenizedChunk

TRACED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass
class _Choice:
    submitted: int  # epoch ns
    first_token: int | None = None
    finished: int | None = None
    finish_reason: str | None = None
    completion_tokens: int = 0


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
            first = c.first_token or c.finished
            if first is None:
                continue  # never ran: aborted or failed before any output
            attrs = {"skiff.choice": index}
            self.tracing.start("queue_and_prefill", self.span, start_time=c.submitted, attributes=attrs).end(
                end_time=first
            )
            if c.finished is not None:
                decode = {**attrs, "gen_ai.usage.output_tokens": c.completion_tokens}
                decode["gen_ai.response.finish_reason"] = c.finish_reason or ""
                self.tracing.start("decode", self.span, start_time=first, attributes=decode).end(
                    end_time=c.finished
                )
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

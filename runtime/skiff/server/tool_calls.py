"""Tool calls in generated text, for the OpenAI chat `tool_calls` field.

Two model formats behind one interface (construct with the declared tool names; `feed()` chunks, then
`finish()`; or `parse()` the whole text):

- "qwen25" (Qwen2.5 / Qwen3 templates): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  blocks anywhere in the text. Content adjacent to a call is stripped on the side facing the call, so
  whitespace-only runs between and after calls disappear.
- "llama3" (Llama 3.1 / 3.2 JSON calls): the whole output, optionally after `<|python_tag|>`, is one or
  more `{"name": ..., "parameters": {...}}` objects separated by ";". It is all or nothing: output
  that starts like a call but is not entirely valid calls is content (it may be a JSON answer).

A block that is not a valid call (bad JSON, no string name, an undeclared tool, arguments not an object)
stays content, unchanged. Any chunking streams the same content and calls (ids aside) as `parse()`.

Forced tool choice (`tool_choice` "required" or a named function) is enforced by a JSON-schema grammar:
`forced_schema`, `parse_forced` and `check_tools` live in tool_choice.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from skiff.server.reasoning import partial_suffix


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # compact JSON object


@dataclass
class ToolDelta:
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def call_from_object(obj: Any, tool_names: frozenset[str], args_keys: tuple[str, ...]) -> ToolCall | None:
    """A ToolCall from a decoded `{"name": ..., <args key>: {...}}`, or None if it is not a valid one.
    Missing arguments count as `{}` (models drop them for tools without parameters)."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or name not in tool_names:
        return None
    args: Any = {}
    for key in args_keys:
        if key in obj:
            args = obj[key]
            break
    if not isinstance(args, dict):
        return None
    return ToolCall(id=new_call_id(), name=name, arguments=compact_json(args))


class ToolParser:
    def __init__(self, tool_names: Iterable[str]) -> None:
        self.tool_names = frozenset(tool_names)

    def parse(self, text: str) -> ToolDelta:
        """The whole-text result; does not touch the streaming state."""
        raise NotImplementedError

    def feed(self, text: str) -> ToolDelta:
        raise NotImplementedError

    def finish(self) -> ToolDelta:
        raise NotImplementedError


class Qwen25Parser(ToolParser):
    OPEN = "<tool_call>"
    CLOSE = "</tool_call>"

    def __init__(self, tool_names: Iterable[str]) -> None:
        super().__init__(tool_names)
        self._buf = ""  # a possible partial OPEN, or an open block waiting for CLOSE
        self._ws = ""  # trailing whitespace of content: dropped if a call follows
        self._after_call = False  # strip the whitespace that follows a call

    def _block_call(self, inner: str) -> ToolCall | None:
        try:
            obj = json.loads(inner)
        except ValueError:
            return None
        return call_from_object(obj, self.tool_names, ("arguments",))

    def parse(self, text: str) -> ToolDelta:
        # Runs of content between valid calls (invalid blocks included verbatim), then strip each run
        # on the sides that face a call.
        runs: list[str] = [""]
        calls: list[ToolCall] = []
        pos = 0
        while (i := text.find(self.OPEN, pos)) >= 0:
            j = text.find(self.CLOSE, i + len(self.OPEN))
            if j < 0:
                break
            end = j + len(self.CLOSE)
            call = self._block_call(text[i + len(self.OPEN) : j])
            if call is None:
                runs[-1] += text[pos:end]
            else:
                runs[-1] += text[pos:i]
                calls.append(call)
                runs.append("")
            pos = end
        runs[-1] += text[pos:]
        last = len(runs) - 1
        parts = [r.rstrip() if n < last else r for n, r in enumerate(runs)]
        parts = [p.lstrip() if n > 0 else p for n, p in enumerate(parts)]
        return ToolDelta(content="".join(parts), calls=calls)

    def feed(self, text: str) -> ToolDelta:
        self._buf += text
        out = ToolDelta()
        while True:
            i = self._buf.find(self.OPEN)
            if i < 0:
                keep = partial_suffix(self._buf, self.OPEN)
                self._emit(out, self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep :]
                return out
            self._emit(out, self._buf[:i])
            self._buf = self._buf[i:]
            j = self._buf.find(self.CLOSE, len(self.OPEN))
            if j < 0:
                return out
            end = j + len(self.CLOSE)
            call = self._block_call(self._buf[len(self.OPEN) : j])
            if call is None:
                self._emit(out, self._buf[:end])
            else:
                self._ws = ""
                self._after_call = True
                out.calls.append(call)
            self._buf = self._buf[end:]

    def finish(self) -> ToolDelta:
        out = ToolDelta()
        self._emit(out, self._buf)  # a partial marker or an unterminated block is content
        out.content += self._ws
        self._buf = self._ws = ""
        return out

    def _emit(self, out: ToolDelta, text: str) -> None:
        if self._after_call:
            text = text.lstrip()
            if not text:
                return
            self._after_call = False
        body = text.rstrip()
        if body:
            out.content += self._ws + body
            self._ws = text[len(body) :]
        else:
            self._ws += text


class Llama3Parser(ToolParser):
    PYTHON_TAG = "<|python_tag|>"

    def __init__(self, tool_names: Iterable[str]) -> None:
        super().__init__(tool_names)
        self._buf = ""
        self._passthrough = False  # decided: the output is not a tool call

    def _looks_like_call(self, head: str) -> bool:
        return head.startswith("{") or head.startswith(self.PYTHON_TAG)

    def _calls(self, body: str) -> list[ToolCall] | None:
        """Calls for `body` = objects separated by ";" (a trailing one allowed), or None."""
        decoder = json.JSONDecoder()
        calls: list[ToolCall] = []
        pos = 0
        while True:
            try:
                obj, pos = decoder.raw_decode(body, pos)
            except ValueError:
                return None
            call = call_from_object(obj, self.tool_names, ("parameters", "arguments"))
            if call is None:
                return None
            calls.append(call)
            pos = len(body) - len(body[pos:].lstrip())
            if pos == len(body):
                return calls
            if body[pos] != ";":
                return None
            pos = len(body) - len(body[pos + 1 :].lstrip())
            if pos == len(body):
                return calls

    def parse(self, text: str) -> ToolDelta:
        head = text.strip()
        if not self._looks_like_call(head):
            return ToolDelta(content=text)
        body = head.removeprefix(self.PYTHON_TAG).lstrip()
        calls = self._calls(body)
        if calls is None:
            return ToolDelta(content=text)
        return ToolDelta(calls=calls)

    def feed(self, text: str) -> ToolDelta:
        if self._passthrough:
            return ToolDelta(content=text)
        self._buf += text
        head = self._buf.lstrip()
        if self._looks_like_call(head) or self.PYTHON_TAG.startswith(head):
            return ToolDelta()  # a call, or still could be one: decided at finish()
        self._passthrough = True
        buf, self._buf = self._buf, ""
        return ToolDelta(content=buf)

    def finish(self) -> ToolDelta:
        buf, self._buf = self._buf, ""
        return self.parse(buf) if buf else ToolDelta()


TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "qwen25": Qwen25Parser,
    "llama3": Llama3Parser,
}


def parse(parser_name: str, text: str, tool_names: Iterable[str]) -> ToolDelta:
    return TOOL_PARSERS[parser_name](tool_names).parse(text)


def detect_tool_parser(chat_template: str | None) -> str | None:
    if not chat_template:
        return None
    if "<tool_call>" in chat_template:
        return "qwen25"
    if "<|python_tag|>" in chat_template or (
        "parameters" in chat_template and "tools" in chat_template and "<|start_header_id|>" in chat_template
    ):
        return "llama3"
    return None

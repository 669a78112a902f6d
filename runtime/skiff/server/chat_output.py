"""What one chat choice's generated text becomes in the response: reasoning, content and tool calls.

A choice's text runs through the reasoning parser (when the template thinks), then the content through the
tool-call parser (tool_choice "auto") or, for a forced choice, is parsed as the grammar-shaped JSON at the
end. Streaming and whole-text results are the same: the parsers hold back only what may still change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from skiff.server.reasoning import REASONING_PARSERS, ThinkTagParser
from skiff.server.tool_calls import TOOL_PARSERS, ToolCall, ToolParser
from skiff.server.tool_choice import parse_forced


@dataclass(frozen=True)
class ChatOutputSpec:
    """Per request: which parsers shape the answer (None: plain content)."""

    reasoning_parser: str | None = None
    tool_parser: str | None = None  # for tool_choice "auto"
    tool_names: tuple[str, ...] = ()
    forced_choice: str | dict[str, Any] | None = None  # "required" or a named function


@dataclass
class Piece:
    """One update of a choice's answer."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    first_call: int = 0  # the index of calls[0] among the choice's calls

    def then(self, later: Piece) -> Piece:
        return Piece(
            self.reasoning + later.reasoning,
            self.content + later.content,
            self.calls + later.calls,
            self.first_call,
        )

    def delta(self) -> dict[str, Any]:
        """The streamed `delta` object."""
        d: dict[str, Any] = {}
        if self.reasoning:
            d["reasoning_content"] = self.reasoning
        if self.content:
            d["content"] = self.content
        if self.calls:
            d["tool_calls"] = [
                {"index": self.first_call + k, **tool_call_body(c)} for k, c in enumerate(self.calls)
            ]
        return d


def tool_call_body(c: ToolCall) -> dict[str, Any]:
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


class AnswerShaper:
    """feed() each new text of the choice, then finish(); `calls` counts the tool calls emitted so far."""

    def __init__(self, spec: ChatOutputSpec) -> None:
        self.spec = spec
        self.reasoning: ThinkTagParser | None = (
            REASONING_PARSERS[spec.reasoning_parser]() if spec.reasoning_parser else None
        )
        self.tools: ToolParser | None = None
        if spec.forced_choice is None and spec.tool_parser and spec.tool_names:
            self.tools = TOOL_PARSERS[spec.tool_parser](spec.tool_names)
        self._forced_text: list[str] = []
        self.calls = 0

    def feed(self, text: str) -> Piece:
        if self.reasoning is None:
            return self._numbered(self._content(text))
        r = self.reasoning.feed(text)
        piece = self._content(r.content)
        piece.reasoning = r.reasoning
        return self._numbered(piece)

    def finish(self) -> Piece:
        """The rest; a forced choice's JSON becomes its calls here (ValueError if it does not parse)."""
        piece = Piece()
        if self.reasoning is not None:
            r = self.reasoning.finish()
            piece = self._content(r.content)
            piece.reasoning = r.reasoning
        if self.tools is not None:
            rest = self.tools.finish()
            piece.content += rest.content
            piece.calls += rest.calls
        if self.spec.forced_choice is not None:
            text = "".join(self._forced_text)
            try:
                piece.calls += parse_forced(text, self.spec.forced_choice)
            except ValueError:  # cut short (finish "length"): the text as it is, never lost
                piece.content += text
        return self._numbered(piece)

    def _numbered(self, piece: Piece) -> Piece:
        piece.first_call = self.calls
        self.calls += len(piece.calls)
        return piece

    def _content(self, text: str) -> Piece:
        if self.spec.forced_choice is not None:  # pure JSON for the calls: no content
            self._forced_text.append(text)
            return Piece()
        if self.tools is None:
            return Piece(content=text)
        d = self.tools.feed(text)
        return Piece(content=d.content, calls=list(d.calls))

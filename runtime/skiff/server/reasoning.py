"""Separate a model's "thinking" from its answer for templates that emit `<think>...</think>`.

Output that opens with the start tag (leading whitespace allowed) is reasoning up to the end tag and
content after it; the whitespace right after the end tag (Qwen3 emits "</think>\n\n") is dropped. A
parser built with `starts_in_reasoning` is for prompts that already opened the block (DeepSeek-R1): its
output is reasoning until the end tag. Output that never reaches the end tag is all reasoning.

Streaming holds back only text that could still become a tag, so the concatenated deltas of any chunking
equal `split()` of the whole text, and no tag character is ever emitted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, auto


@dataclass
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


class _State(Enum):
    START = auto()  # undecided: nothing but whitespace or a prefix of the start tag seen yet
    REASONING = auto()
    AFTER_END = auto()  # end tag seen; dropping the whitespace that follows it
    CONTENT = auto()


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (text held back)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ThinkTagParser:
    def __init__(
        self, start: str = "<think>", end: str = "</think>", starts_in_reasoning: bool = False
    ) -> None:
        if not start or not end:
            raise ValueError("reasoning tags must not be empty")
        self.start = start
        self.end = end
        self.starts_in_reasoning = starts_in_reasoning
        self._state = _State.START
        self._buf = ""

    def split(self, text: str) -> ReasoningDelta:
        """The whole-text result; does not touch the streaming state."""
        stripped = text.lstrip()
        if stripped.startswith(self.start):
            body = stripped[len(self.start) :]
        elif self.starts_in_reasoning:
            body = text
        else:
            return ReasoningDelta(content=text)
        reasoning, found, rest = body.partition(self.end)
        if not found:
            return ReasoningDelta(reasoning=body)
        return ReasoningDelta(reasoning=reasoning, content=rest.lstrip())

    def feed(self, text: str) -> ReasoningDelta:
        self._buf += text
        out = ReasoningDelta()
        if self._state is _State.START:
            self._decide_start(out)
        if self._state is _State.REASONING:
            self._scan_reasoning(out)
        if self._state is _State.AFTER_END:
            rest = self._buf.lstrip()
            self._buf = ""
            if rest:
                self._state = _State.CONTENT
                out.content += rest
        elif self._state is _State.CONTENT:
            out.content += self._buf
            self._buf = ""
        return out

    def finish(self) -> ReasoningDelta:
        """Flush what was held back: a tag prefix that never completed is ordinary text."""
        buf, self._buf = self._buf, ""
        if self._state is _State.START:
            self._state = _State.CONTENT
            if self.starts_in_reasoning:
                return ReasoningDelta(reasoning=buf)
            return ReasoningDelta(content=buf)
        if self._state is _State.REASONING:
            return ReasoningDelta(reasoning=buf)
        return ReasoningDelta(content=buf)

    def _decide_start(self, out: ReasoningDelta) -> None:
        head = self._buf.lstrip()
        if head.startswith(self.start):
            self._buf = head[len(self.start) :]
            self._state = _State.REASONING
        elif not head or self.start.startswith(head):
            return  # could still open with the start tag
        elif self.starts_in_reasoning:
            self._state = _State.REASONING
        else:
            self._state = _State.CONTENT

    def _scan_reasoning(self, out: ReasoningDelta) -> None:
        reasoning, found, rest = self._buf.partition(self.end)
        if found:
            out.reasoning += reasoning
            self._buf = rest
            self._state = _State.AFTER_END
            return
        keep = partial_suffix(self._buf, self.end)
        out.reasoning += self._buf[: len(self._buf) - keep]
        self._buf = self._buf[len(self._buf) - keep :]


def split(text: str, parser: str = "qwen3") -> ReasoningDelta:
    """Whole-text split with a registered parser's configuration."""
    return REASONING_PARSERS[parser]().split(text)


def prompt_opens_reasoning(prompt: str, start: str = "<think>", end: str = "</think>") -> bool:
    """Whether the rendered prompt leaves a think block open (its last start tag follows its last end
    tag), as templates that force thinking do; the output then needs `starts_in_reasoning`."""
    return prompt.rfind(start) > prompt.rfind(end)


REASONING_PARSERS: dict[str, Callable[[], ThinkTagParser]] = {
    "qwen3": lambda: ThinkTagParser(starts_in_reasoning=False),
    "deepseek-r1": lambda: ThinkTagParser(starts_in_reasoning=True),
}


def detect_reasoning_parser(chat_template: str | None) -> str | None:
    if chat_template and "<think>" in chat_template:
        return "qwen3"
    return None

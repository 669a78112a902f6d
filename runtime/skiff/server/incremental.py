"""Incremental, UTF-8-safe detokenization and stop-string matching for one request.

Text is decoded from a window that starts a few tokens back (`prefix_offset`) so that tokenizers whose
pieces depend on their left context (SentencePiece's leading space, byte-level BPE's split multi-byte
characters) produce the same characters as a full decode. A window that ends in U+FFFD is an incomplete
UTF-8 sequence: it is held back until the next token completes it.

Stop strings: text that could still become the start of a stop string is held back, so no client ever
receives text that a later token turns into a stop (the streamed text always equals the final text).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[Sequence[int]], str]


class IncrementalDecoder:
    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def push(self, token_ids: Sequence[int]) -> str:
        """New text made complete by `token_ids` (possibly empty)."""
        self.ids.extend(token_ids)
        prefix = self._decode(self.ids[self._prefix_offset : self._read_offset])
        full = self._decode(self.ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.ids)
            return full[len(prefix) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes as U+FFFD) at the end."""
        prefix = self._decode(self.ids[self._prefix_offset : self._read_offset])
        full = self._decode(self.ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self.ids)
        return full[len(prefix) :] if len(full) > len(prefix) else ""


class StopMatcher:
    """Accumulates a request's text; releases what can no longer be part of a stop string."""

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = [s for s in stop if s]
        self.text = ""
        self._sent = 0
        self.matched: str | None = None

    def feed(self, delta: str, final: bool = False) -> str:
        """Text that is safe to send now. After a match, `matched` is set and nothing more is released."""
        if self.matched is not None:
            return ""
        self.text += delta
        if self.stop:
            # a stop string can only newly appear in a window that reaches into the unsent text
            start = max(0, self._sent - max(len(s) for s in self.stop) + 1)
            hit: tuple[int, str] | None = None
            for s in self.stop:
                pos = self.text.find(s, start)
                if pos != -1 and (hit is None or pos < hit[0]):
                    hit = (pos, s)
            if hit is not None:
                self.matched = hit[1]
                self.text = self.text[: hit[0]]
                out = self.text[self._sent :]
                self._sent = len(self.text)
                return out
        end = len(self.text) if final else len(self.text) - self._held_back()
        end = max(end, self._sent)
        out = self.text[self._sent : end]
        self._sent = end
        return out

    def _held_back(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of some stop string."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best

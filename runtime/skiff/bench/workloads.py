"""Request workloads for `skiff bench serve`: random lengths, or groups sharing a long prefix."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "been",
    "one",
    "all",
    "we",
    "their",
    "has",
    "would",
    "when",
    "if",
    "so",
    "no",
    "will",
    "more",
    "can",
    "out",
    "up",
    "about",
    "into",
    "them",
    "some",
    "what",
    "time",
    "could",
    "other",
    "than",
    "then",
    "now",
    "only",
    "its",
    "over",
    "also",
    "new",
    "two",
    "may",
    "any",
    "after",
]


@dataclass
class BenchRequest:
    prompt: str | list[int]
    prompt_len: int  # tokens, as the workload built it (the server's usage count wins when it reports one)
    max_tokens: int


class PromptMaker:
    """Text of (about) n tokens: random token ids decoded by a tokenizer, or random words without one."""

    def __init__(self, tokenizer: Any | None, rng: random.Random) -> None:
        self.tok, self.rng = tokenizer, rng
        self.vocab = len(tokenizer) if tokenizer is not None else 0

    def ids(self, n: int) -> list[int]:
        # stay clear of the special tokens at the bottom and top of most vocabularies
        lo, hi = min(100, self.vocab - 1), max(101, self.vocab - 300)
        return [self.rng.randint(lo, hi) for _ in range(n)]

    def text(self, n: int) -> tuple[str, int]:
        if self.tok is None:
            return " ".join(self.rng.choice(_WORDS) for _ in range(n)), n
        text = self.tok.decode(self.ids(n), skip_special_tokens=True)
        ids = self.tok.encode(text, add_special_tokens=False)[:n]  # decode/encode does not round-trip exactly
        text = self.tok.decode(ids, skip_special_tokens=True)
        return text, len(ids)


def _lengths(rng: random.Random, n: int, length: int, ratio: float) -> list[int]:
    lo = max(1, int(length * ratio))
    return [rng.randint(lo, max(lo, length)) for _ in range(n)]


def random_workload(
    maker: PromptMaker, num: int, input_len: int, output_len: int, range_ratio: float, as_ids: bool
) -> list[BenchRequest]:
    rng = maker.rng
    ins, outs = _lengths(rng, num, input_len, range_ratio), _lengths(rng, num, output_len, range_ratio)
    reqs = []
    for n_in, n_out in zip(ins, outs, strict=True):
        if as_ids:
            reqs.append(BenchRequest(maker.ids(n_in), n_in, n_out))
        else:
            text, n = maker.text(n_in)
            reqs.append(BenchRequest(text, n, n_out))
    return reqs


def shared_prefix_workload(
    maker: PromptMaker, num: int, groups: int, prefix_len: int, suffix_len: int, output_len: int, as_ids: bool
) -> list[BenchRequest]:
    """`groups` system prompts of prefix_len tokens; each request adds its own suffix_len-token question."""
    reqs = []
    prefixes = [maker.ids(prefix_len) if as_ids else maker.text(prefix_len) for _ in range(groups)]
    for i in range(num):
        prefix = prefixes[i % groups]
        if as_ids:
            ids = list(prefix) + maker.ids(suffix_len)  # type: ignore[arg-type]
            reqs.append(BenchRequest(ids, len(ids), output_len))
        else:
            suffix, n = maker.text(suffix_len)
            text, n_prefix = prefix  # type: ignore[misc]
            reqs.append(BenchRequest(f"{text}\n{suffix}", n_prefix + n, output_len))
    maker.rng.shuffle(reqs)
    return reqs

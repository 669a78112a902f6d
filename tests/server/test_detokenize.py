"""Incremental detokenization and stop strings, with the embedded model's real tokenizer."""

from __future__ import annotations

import random

import pytest
from skiff.embedded import embedded_model_path
from skiff.server.incremental import IncrementalDecoder, StopMatcher
from skiff.tokenizer import load_tokenizer

TEXTS = [
    "Hello, world! The capital of France is Paris.",
    "Ünïcödé: naïve café, 東京は日本の首都です。 emoji: 🚀🔥👩‍💻 done",
    "  leading spaces\n\nand\ttabs  ",
    "def f(x):\n    return x ** 2  # squares",
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(embedded_model_path())


def stream(tok, ids: list[int], chunk: int = 1) -> list[str]:
    dec = IncrementalDecoder(lambda xs: tok.decode(list(xs), skip_special_tokens=True))
    pieces = [dec.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    return [*pieces, dec.flush()]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 3])
def test_incremental_equals_full_decode(tok, text: str, chunk: int) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    pieces = stream(tok, ids, chunk)
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True) == text
    assert not any("\ufffd" in p for p in pieces)  # never a half character


def test_random_token_streams_match_full_decode(tok) -> None:
    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.randrange(len(tok)) for _ in range(40)]
        assert "".join(stream(tok, ids)) == tok.decode(ids, skip_special_tokens=True)


def test_stop_string_split_across_tokens_never_leaks() -> None:
    m = StopMatcher(["STOP here"])
    out = [m.feed(d) for d in ["abc S", "TO", "P h", "ere and more"]]
    assert "".join(out) == "abc " and m.matched == "STOP here"
    assert m.feed("later text") == ""


def test_stop_matcher_releases_false_starts() -> None:
    m = StopMatcher(["<end>"])
    assert m.feed("a <e") == "a "
    assert m.feed("x") == "<ex"
    assert m.feed(" <en", final=True) == " <en"
    assert m.matched is None


def test_earliest_stop_wins() -> None:
    m = StopMatcher(["world", "lo"])
    assert m.feed("hello world") == "hel" and m.matched == "lo"

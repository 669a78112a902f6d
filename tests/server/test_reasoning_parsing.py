"""ThinkTagParser: whole-text splits, and streaming that equals them for every chunking."""

from __future__ import annotations

import random

import pytest
from skiff.server.reasoning import (
    REASONING_PARSERS,
    ReasoningDelta,
    ThinkTagParser,
    detect_reasoning_parser,
    prompt_opens_reasoning,
    split,
)


def stream(parser: ThinkTagParser, chunks: list[str]) -> tuple[ReasoningDelta, list[ReasoningDelta]]:
    deltas = [parser.feed(c) for c in chunks] + [parser.finish()]
    total = ReasoningDelta("".join(d.reasoning for d in deltas), "".join(d.content for d in deltas))
    return total, deltas


def chunkings(text: str) -> list[list[str]]:
    """Every two-chunk split, char by char, and some seeded random multi-chunk splits."""
    out = [[text[:i], text[i:]] for i in range(len(text) + 1)]
    out.append(list(text))
    rng = random.Random(len(text))
    for _ in range(20):
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(4, len(text) + 1)))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


QWEN3_CASES = [
    ("<think>\nLet me think.\n</think>\n\nThe answer is 4.", "\nLet me think.\n", "The answer is 4."),
    ("  \n<think>r</think>c", "r", "c"),
    ("Hello, no thinking here.", "", "Hello, no thinking here."),
    ("<think>never closed", "never closed", ""),
    ("<think></think>", "", ""),
    ("<think></think>\n\n", "", ""),
    ("<think>a</think>b</think>c", "a", "b</think>c"),
    ("<think>x<think>y</think>z", "x<think>y", "z"),
    ("a <think>b</think>c", "", "a <think>b</think>c"),
    ("<thi", "", "<thi"),
    ("<think>a</thi", "a</thi", ""),
    ("<think>a</think", "a</think", ""),
    ("   ", "", "   "),
    ("", "", ""),
    ("<think>é 思考 </think>\n答案 \n", "é 思考 ", "答案 \n"),
    ("<thinking>x</thinking>", "", "<thinking>x</thinking>"),
]

R1_CASES = [
    ("Reasoning here.\n</think>\n\nAnswer.", "Reasoning here.\n", "Answer."),
    ("<think>\nexplicit tag</think>ans", "\nexplicit tag", "ans"),
    ("still thinking", "still thinking", ""),
    ("  <thi", "  <thi", ""),  # a start tag that never completes is reasoning text
    ("</think>only answer", "", "only answer"),
    ("\n\nr</think>c", "\n\nr", "c"),
]


@pytest.mark.parametrize(("text", "reasoning", "content"), QWEN3_CASES)
def test_qwen3_split(text: str, reasoning: str, content: str) -> None:
    assert ThinkTagParser().split(text) == ReasoningDelta(reasoning, content)
    assert split(text) == ReasoningDelta(reasoning, content)


@pytest.mark.parametrize(("text", "reasoning", "content"), R1_CASES)
def test_deepseek_r1_split(text: str, reasoning: str, content: str) -> None:
    assert REASONING_PARSERS["deepseek-r1"]().split(text) == ReasoningDelta(reasoning, content)
    assert split(text, "deepseek-r1") == ReasoningDelta(reasoning, content)


@pytest.mark.parametrize("name", sorted(REASONING_PARSERS))
@pytest.mark.parametrize("text", [t for t, _, _ in QWEN3_CASES + R1_CASES])
def test_streaming_equals_split_for_every_chunking(name: str, text: str) -> None:
    expected = REASONING_PARSERS[name]().split(text)
    for chunks in chunkings(text):
        total, _ = stream(REASONING_PARSERS[name](), chunks)
        assert total == expected, chunks


def test_streaming_never_emits_tag_characters() -> None:
    text = "<think>ab</think>\n\ncd"
    for chunks in chunkings(text):
        _, deltas = stream(ThinkTagParser(), chunks)
        assert not any(c in d.reasoning + d.content for d in deltas for c in "<>/"), chunks


def test_holds_back_only_a_possible_tag() -> None:
    p = ThinkTagParser()
    assert p.feed("<thi") == ReasoningDelta()
    assert p.feed("nk>ab") == ReasoningDelta(reasoning="ab")
    assert p.feed("c</") == ReasoningDelta(reasoning="c")
    assert p.feed("x") == ReasoningDelta(reasoning="</x")  # "</x" cannot become "</think>"
    assert p.feed("</think>") == ReasoningDelta()
    assert p.feed("\n\n") == ReasoningDelta()  # the whitespace after the end tag is dropped
    assert p.feed("answer <") == ReasoningDelta(content="answer <")  # content needs no holding back
    assert p.finish() == ReasoningDelta()


def test_content_without_tag_streams_at_once() -> None:
    p = ThinkTagParser()
    assert p.feed("Hi") == ReasoningDelta(content="Hi")
    assert p.feed(" <think>") == ReasoningDelta(content=" <think>")


def test_finish_flushes_a_partial_tag() -> None:
    p = ThinkTagParser()
    assert p.feed("<think>a</think") == ReasoningDelta(reasoning="a")
    assert p.finish() == ReasoningDelta(reasoning="</think")
    p = ThinkTagParser()
    assert p.feed(" <th") == ReasoningDelta()
    assert p.finish() == ReasoningDelta(content=" <th")


def test_custom_tags() -> None:
    p = ThinkTagParser("[R]", "[/R]")
    assert p.split("[R]why[/R] because") == ReasoningDelta("why", "because")
    total, _ = stream(ThinkTagParser("[R]", "[/R]"), list("[R]why[/R] because"))
    assert total == ReasoningDelta("why", "because")
    with pytest.raises(ValueError):
        ThinkTagParser("", "</think>")


def test_registry_and_detection() -> None:
    assert REASONING_PARSERS["qwen3"]().starts_in_reasoning is False
    assert REASONING_PARSERS["deepseek-r1"]().starts_in_reasoning is True
    qwen3_template = "{%- if enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    assert detect_reasoning_parser(qwen3_template) == "qwen3"
    assert detect_reasoning_parser("{{ messages }}<|im_start|>assistant") is None
    assert detect_reasoning_parser(None) is None
    assert detect_reasoning_parser("") is None


def test_prompt_opens_reasoning() -> None:
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")
    history = "<think>\nold\n</think>\n\nold answer<|im_end|>\n<|im_start|>assistant\n"
    assert not prompt_opens_reasoning(history)
    assert prompt_opens_reasoning(history + "<think>\n")

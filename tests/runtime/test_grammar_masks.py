"""Grammar masks on the embedded model's tokenizer: the bitmask's unpacking, masked logits, completion."""

from __future__ import annotations

import json

import pytest
import torch
from skiff.constrained.grammar import Grammar, GrammarError, to_llguidance
from skiff.constrained.masks import GrammarMasks, advance, unpack_bitmask
from skiff.embedded import embedded_model_path
from skiff.params import InvalidRequest

VOCAB = 49152
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def masks() -> GrammarMasks:
    return GrammarMasks(str(embedded_model_path()), VOCAB, [2])


def test_unpack_bitmask_reads_bit_j_of_word_w_as_token_32w_plus_j() -> None:
    gen = torch.Generator().manual_seed(0)
    words = torch.randint(-(2**31), 2**31 - 1, (3, 4), dtype=torch.int32, generator=gen)
    got = unpack_bitmask(words, 100)
    for row in range(3):
        for token in range(100):
            bit = (int(words[row, token // 32]) >> (token % 32)) & 1
            assert bool(got[row, token]) == bool(bit)


def test_masked_rows_allow_exactly_the_grammars_tokens(masks: GrammarMasks) -> None:
    matcher = masks.matcher(Grammar("json_schema", json.dumps(SCHEMA)))
    logits = torch.randn(3, VOCAB)
    out = masks.masked(logits, [None, matcher, None])
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])  # unconstrained rows untouched
    allowed = torch.isfinite(out[1]).nonzero().flatten().tolist()
    expected = unpack_bitmask(
        torch.frombuffer(bytearray(matcher.compute_bitmask()), dtype=torch.int32)[None], VOCAB
    )
    assert allowed == expected[0].nonzero().flatten().tolist()
    assert 0 < len(allowed) < VOCAB
    assert torch.equal(out[1][allowed], logits[1][allowed])


def test_advance_reports_a_complete_grammar(masks: GrammarMasks) -> None:
    from skiff.tokenizer import load_tokenizer

    tok = load_tokenizer(embedded_model_path())
    matcher = masks.matcher(Grammar("regex", "ab(c|d)"))
    ids = tok.encode("abd", add_special_tokens=False)
    done = [advance(matcher, t) for t in ids]
    assert done == [False] * (len(ids) - 1) + [True]


def test_grammars_that_do_not_compile_are_named_errors(masks: GrammarMasks) -> None:
    with pytest.raises(GrammarError, match="Invalid type"):
        to_llguidance(Grammar("json_schema", '{"type": "objekt"}'))
    with pytest.raises(GrammarError, match="not valid JSON"):
        to_llguidance(Grammar("json_schema", "{type"))
    with pytest.raises(InvalidRequest, match="regex"):
        masks.matcher(Grammar("regex", "[a-"))

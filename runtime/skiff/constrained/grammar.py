"""What a constrained request must produce, as the API states it, and its compilation for the grammar engine.

The grammar engine is llguidance: a Rust matcher per request that computes each step's allowed tokens as a
bitmask (the engine applies it in the batched sampler, `masks.py`). This module is torch-free: the API
server checks a grammar here before any token is generated, so a bad schema is a 400, never a failed stream.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

GrammarKind = Literal["json_schema", "regex", "ebnf", "lark"]

# Compact JSON: the schema's tokens and nothing else (a random-weight or small model would otherwise be
# free to fill its budget with whitespace and never close the object).
_JSON_OPTIONS = {"whitespace_flexible": False}


@dataclass(frozen=True)
class Grammar:
    kind: GrammarKind
    source: str  # a JSON schema (as JSON text), a regex, a GBNF (SGLang's `ebnf`) or a Lark grammar


class GrammarError(ValueError):
    """A grammar the engine cannot compile; the message names the problem."""


def _json_schema(source: str) -> str:
    import llguidance

    try:
        schema = json.loads(source)
    except json.JSONDecodeError as e:
        raise GrammarError(f"the JSON schema is not valid JSON: {e}") from e
    if not isinstance(schema, dict | bool):
        raise GrammarError("a JSON schema must be an object or a boolean")
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_OPTIONS)
    except ValueError as e:
        raise GrammarError(str(e)) from e


def _regex(source: str) -> str:
    import llguidance

    return llguidance.LLMatcher.grammar_from_regex(source)


def _ebnf(source: str) -> str:
    import llguidance
    from llguidance.gbnf_to_lark import GbnfToLarkError, gbnf_to_lark

    try:
        return llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(source))
    except (GbnfToLarkError, ValueError) as e:
        raise GrammarError(f"bad EBNF grammar: {e}") from e


def _lark(source: str) -> str:
    import llguidance

    return llguidance.LLMatcher.grammar_from_lark(source)


COMPILERS: dict[GrammarKind, Callable[[str], str]] = {
    "json_schema": _json_schema,
    "regex": _regex,
    "ebnf": _ebnf,
    "lark": _lark,
}


def compiled(grammar: Grammar) -> str:
    """The grammar in llguidance's own form, unchecked (the engine's matcher reports what is wrong)."""
    return COMPILERS[grammar.kind](grammar.source)


def to_llguidance(grammar: Grammar) -> str:
    """The grammar in llguidance's own form; raises GrammarError when it does not compile."""
    import llguidance

    compiled_grammar = compiled(grammar)
    problem = llguidance.LLMatcher.validate_grammar(compiled_grammar)
    if problem:
        raise GrammarError(f"the {grammar.kind} grammar does not compile: {problem.strip()}")
    return compiled_grammar


def json_object() -> Grammar:
    """OpenAI's `json_object` response format: any JSON object."""
    return Grammar("json_schema", '{"type": "object"}')

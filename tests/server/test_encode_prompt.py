"""The tokenizer worker's prompt encoding, by prompt type, on a stand-in tokenizer."""

from __future__ import annotations

from typing import Any

import pytest
from skiff.server.messages import ChatPrompt, TextPrompt, TokenIdsPrompt
from skiff.server.tokenizer_proc import PromptError, encode_prompt


class FakeTokenizer:
    chat_template = "{{ messages }}"

    def __init__(self) -> None:
        self.template_calls: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return 100

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return [len(text), int(add_special_tokens)]

    def apply_chat_template(self, messages: list[dict[str, Any]], tokenize: bool, **kwargs: Any) -> str:
        self.template_calls.append(kwargs)
        return "x" * len(messages)


def test_each_prompt_type() -> None:
    tok = FakeTokenizer()
    assert encode_prompt(tok, TokenIdsPrompt([1, 99])) == [1, 99]
    assert encode_prompt(tok, TextPrompt("hello")) == [5, 1]
    assert encode_prompt(tok, ChatPrompt([{"role": "user", "content": "hi"}])) == [1, 0]
    assert tok.template_calls == [{"add_generation_prompt": True}]


def test_template_kwargs_may_turn_the_generation_prompt_off() -> None:
    tok = FakeTokenizer()
    encode_prompt(tok, ChatPrompt([], {"add_generation_prompt": False, "enable_thinking": True}))
    assert tok.template_calls == [{"add_generation_prompt": False, "enable_thinking": True}]


def test_out_of_vocab_ids_are_a_prompt_error() -> None:
    with pytest.raises(PromptError, match="out of range"):
        encode_prompt(FakeTokenizer(), TokenIdsPrompt([100]))

"""Structured outputs, tool calling and reasoning content through the official `openai` client against real
`skiff serve` processes: the embedded SmolLM2 and a random-weight Qwen3 with a Qwen-format chat template.

Constrained output must always satisfy its constraint (many seeds, temperatures > 0), forced tool calls
always parse and name a declared function, and streamed deltas concatenate to the non-streamed answer
under greedy sampling."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pytest
from support.chat_templates import QWEN_STYLE
from support.random_models import build_random_model
from support.serve import ServerProcess

M = "SmolLM2-135M-Instruct"
QWEN = "qwen3_qknorm_yarn"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "pets", "address"],
    "additionalProperties": False,
}
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
ASK_PERSON = [{"role": "user", "content": "Describe a person as JSON."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}, "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "maxLength": 8}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
SAMPLED = [(0.7, 0), (1.0, 1), (1.3, 2)]  # (temperature, seed)


def _chat_stream(client: openai.OpenAI, **kw) -> tuple[dict[str, str], list[dict], str | None]:
    """The concatenated streamed deltas of choice 0: text fields, tool calls by index, finish reason."""
    text = {"content": "", "reasoning_content": ""}
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            d = c.delta.model_dump()
            for key in text:
                text[key] += d.get(key) or ""
            for tc in d.get("tool_calls") or []:
                got = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
                got["name"] += tc["function"].get("name") or ""
                got["arguments"] += tc["function"].get("arguments") or ""
            finish = c.finish_reason or finish
    return text, [calls[i] for i in sorted(calls)], finish


# ------------------------------------------------------------------------------- structured outputs
def test_json_schema_output_is_always_valid(client: openai.OpenAI) -> None:
    for temperature, seed in SAMPLED:
        r = client.chat.completions.create(
            model=M,
            messages=ASK_PERSON,
            response_format=PERSON_FORMAT,
            temperature=temperature,
            seed=seed,
            n=4,
            max_tokens=200,
        )
        for choice in r.choices:
            assert choice.finish_reason == "stop", choice
            jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_json_object_is_an_object(client: openai.OpenAI) -> None:
    for seed in range(3):
        r = client.chat.completions.create(
            model=M,
            messages=[{"role": "user", "content": "Reply with a JSON object with the keys a and b."}],
            response_format={"type": "json_object"},
            temperature=0.8,
            seed=seed,
            max_tokens=400,
        )
        choice = r.choices[0]
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict), choice.message.content
        else:  # cut by the budget: still the start of an object
            assert choice.message.content.startswith("{"), choice.message.content


def test_regex_and_ebnf_outputs_match(client: openai.OpenAI) -> None:
    cases = [
        ({"regex": r"\d{3}-\d{4}"}, r"\d{3}-\d{4}"),
        (
            {"ebnf": 'root ::= answer ", " digit digit?\nanswer ::= "yes" | "no"\ndigit ::= [0-9]'},
            r"(yes|no), \d\d?",
        ),
    ]
    for extra, pattern in cases:
        for temperature, seed in SAMPLED:
            r = client.completions.create(
                model=M,
                prompt="Answer:",
                max_tokens=20,
                temperature=temperature,
                seed=seed,
                n=3,
                extra_body=extra,
            )
            for choice in r.choices:
                assert re.fullmatch(pattern, choice.text), (extra, choice.text)
                assert choice.finish_reason == "stop"


def test_streamed_constrained_output_equals_the_whole_answer(client: openai.OpenAI) -> None:
    kw = dict(model=M, messages=ASK_PERSON, response_format=PERSON_FORMAT, temperature=0, max_tokens=200)
    whole = client.chat.completions.create(**kw)
    streamed, calls, finish = _chat_stream(client, **kw)
    assert streamed["content"] == whole.choices[0].message.content
    assert (calls, finish) == ([], "stop")
    pieces = client.completions.create(
        model=M,
        prompt="Date:",
        max_tokens=20,
        temperature=0,
        stream=True,
        extra_body={"regex": r"20\d\d-[01]\d"},
    )
    text = "".join(c.choices[0].text for c in pieces if c.choices)
    assert re.fullmatch(r"20\d\d-[01]\d", text), text


def test_logprobs_and_n_under_a_grammar(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=M,
        messages=ASK_PERSON,
        response_format=PERSON_FORMAT,
        temperature=0.9,
        seed=5,
        n=3,
        max_tokens=200,
        logprobs=True,
        top_logprobs=2,
    )
    assert len(r.choices) == 3
    for choice in r.choices:
        entries = choice.logprobs.content
        assert "".join(e.token for e in entries) == choice.message.content
        assert all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in entries)
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)


def test_a_stop_string_across_tokens_ends_constrained_output(client: openai.OpenAI) -> None:
    kw = dict(
        model=M,
        prompt="Code:",
        max_tokens=30,
        temperature=0,
        stop=["c-d"],
        extra_body={"regex": "abc-def-ghi"},
    )
    whole = client.completions.create(**kw)
    assert (whole.choices[0].text, whole.choices[0].finish_reason) == ("ab", "stop")
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
    assert streamed == "ab"


# ------------------------------------------------------------------------------------ tool calling
def _check_call(name: str, arguments: str) -> None:
    assert name in PARAMS, name
    jsonschema.validate(json.loads(arguments), PARAMS[name])


def test_required_tool_choice_always_gives_a_declared_call(client: openai.OpenAI) -> None:
    for temperature, seed in SAMPLED:
        r = client.chat.completions.create(
            model=M,
            messages=ASK_WEATHER,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=temperature,
            seed=seed,
            n=3,
            max_tokens=100,
        )
        for choice in r.choices:
            assert choice.finish_reason == "tool_calls", choice
            (call,) = choice.message.tool_calls
            assert call.type == "function" and call.id.startswith("call_")
            _check_call(call.function.name, call.function.arguments)


def test_named_tool_choice_calls_that_function(client: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    for temperature, seed in SAMPLED:
        r = client.chat.completions.create(
            model=M,
            messages=ASK_WEATHER,
            tools=TOOLS,
            tool_choice=named,
            temperature=temperature,
            seed=seed,
            max_tokens=60,
        )
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == "get_time"
        _check_call("get_time", call.function.arguments)
    kw = dict(model=M, messages=ASK_WEATHER, tools=TOOLS, tool_choice=named, temperature=0, max_tokens=60)
    whole = client.chat.completions.create(**kw).choices[0]
    text, calls, finish = _chat_stream(client, **kw)
    assert calls == [{"name": "get_time", "arguments": whole.message.tool_calls[0].function.arguments}]
    assert (text["content"], finish) == ("", whole.finish_reason)


def test_tool_choice_none_and_bad_tools(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=M, messages=ASK_WEATHER, tools=TOOLS, tool_choice="none", max_tokens=8, temperature=0
    )
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    bad = [
        dict(tools=TOOLS + [TOOLS[0]]),  # a duplicate name
        dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
        dict(tool_choice="required"),  # nothing to call
        dict(tools=[{"type": "function", "function": {"name": "f", "parameters": [1]}}]),
        dict(tools=[{"type": "function", "function": {"name": "no spaces"}}]),
        dict(tools=TOOLS, tool_choice="required", response_format=PERSON_FORMAT),
    ]
    for extra in bad:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=M, messages=ASK_WEATHER, max_tokens=4, **extra)
        assert err.value.body["message"], extra


# ------------------------------------------------------- Qwen-format template: auto tools, reasoning
@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    from skiff.embedded import embedded_model_path
    from skiff.tokenizer import load_tokenizer

    tok = load_tokenizer(embedded_model_path())
    tok.chat_template = QWEN_STYLE
    model: Path = build_random_model("qwen3_qknorm_yarn", tmp_path_factory.mktemp("qwen"), tok)
    srv = ServerProcess("--model", str(model), api_key=None).wait_ready()
    try:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=120, max_retries=0)
    finally:
        srv.stop()


CALL = '{"name": "get_weather", "arguments": {"city": "Rome", "unit": "c"}}'
CALL_TEXT = f"Let me check.\n<tool_call>\n{CALL}\n</tool_call>"


def test_auto_tool_calls_are_parsed_from_the_qwen_format(qwen: openai.OpenAI) -> None:
    # random weights never choose a call by themselves: a regex makes the model write one
    kw = dict(
        model=QWEN,
        messages=ASK_WEATHER,
        tools=TOOLS,
        temperature=0,
        max_tokens=80,
        extra_body={"regex": re.escape(CALL_TEXT)},
    )
    r = qwen.chat.completions.create(**kw).choices[0]
    assert r.finish_reason == "tool_calls"
    assert r.message.content == "Let me check."
    (call,) = r.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Rome", "unit": "c"},
    )
    text, calls, finish = _chat_stream(qwen, **kw)
    assert (text["content"], finish) == ("Let me check.", "tool_calls")
    assert calls == [{"name": "get_weather", "arguments": call.function.arguments}]
    # an undeclared function in the same format stays content
    other = CALL_TEXT.replace("get_weather", "launch")
    r = qwen.chat.completions.create(**kw | {"extra_body": {"regex": re.escape(other)}}).choices[0]
    assert (r.message.content, r.message.tool_calls, r.finish_reason) == (other, None, "stop")


def test_reasoning_content_is_separated(qwen: openai.OpenAI) -> None:
    thinking = r"<think>\n[a-z]{1,8}( [a-z]{1,8}){0,3}\n</think>\n\n[a-z]{1,8}( [a-z]{1,8}){0,3}"
    for temperature, seed in [(0, 0), *SAMPLED]:
        kw = dict(
            model=QWEN,
            messages=ASK_WEATHER,
            temperature=temperature,
            seed=seed,
            max_tokens=60,
            extra_body={"regex": thinking},
        )
        msg = qwen.chat.completions.create(**kw).choices[0].message
        reasoning = msg.model_dump()["reasoning_content"]
        assert re.fullmatch(r"[a-z]{1,8}( [a-z]{1,8}){0,3}", reasoning.strip()), reasoning
        assert re.fullmatch(r"[a-z]{1,8}( [a-z]{1,8}){0,3}", msg.content), msg.content
        if temperature == 0:
            text, _, _ = _chat_stream(qwen, **kw)
            assert (text["reasoning_content"], text["content"]) == (reasoning, msg.content)


def test_template_kwargs_and_tool_history_reach_the_prompt(qwen: openai.OpenAI) -> None:
    def prompt_tokens(messages: list[dict], **kw) -> int:
        r = qwen.chat.completions.create(model=QWEN, messages=messages, max_tokens=1, temperature=0, **kw)
        return r.usage.prompt_tokens

    plain = prompt_tokens(ASK_WEATHER)
    no_thinking = prompt_tokens(ASK_WEATHER, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert no_thinking > plain  # the template closed an empty think block
    with_tools = prompt_tokens(ASK_WEATHER, tools=TOOLS)
    assert with_tools > plain + 40  # the signatures are in the system turn
    history = ASK_WEATHER + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 degrees."},
    ]
    assert prompt_tokens(history, tools=TOOLS) > with_tools + 20

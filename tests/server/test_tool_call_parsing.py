"""Tool-call parsers (whole text and every chunking), forced tool choice schemas, and tools checks."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import jsonschema
import llguidance
import pytest
from skiff.server.tool_calls import (
    TOOL_PARSERS,
    ToolCall,
    ToolDelta,
    detect_tool_parser,
    parse,
)
from skiff.server.tool_choice import check_tools, forced_schema, parse_forced

NAMES = {"get_weather", "get_time"}
W = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
T = '{"name": "get_time", "arguments": {}}'


def calls(delta: ToolDelta) -> list[tuple[str, str]]:
    return [(c.name, c.arguments) for c in delta.calls]


def stream(parser_name: str, chunks: list[str]) -> ToolDelta:
    parser = TOOL_PARSERS[parser_name](NAMES)
    deltas = [parser.feed(c) for c in chunks] + [parser.finish()]
    return ToolDelta("".join(d.content for d in deltas), [c for d in deltas for c in d.calls])


def chunkings(text: str) -> list[list[str]]:
    out = [[text[:i], text[i:]] for i in range(len(text) + 1)]
    out.append(list(text))
    rng = random.Random(len(text))
    for _ in range(20):
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(5, len(text) + 1)))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


WEATHER = ("get_weather", '{"city":"Paris","days":2}')
TIME = ("get_time", "{}")

QWEN_CASES: list[tuple[str, str, list[tuple[str, str]]]] = [
    (f"<tool_call>\n{W}\n</tool_call>", "", [WEATHER]),
    (f"<tool_call>\n{W}\n</tool_call>\n<tool_call>\n{T}\n</tool_call>\n", "", [WEATHER, TIME]),
    (f"Let me check.\n\n<tool_call>\n{W}\n</tool_call>", "Let me check.", [WEATHER]),
    (f"<tool_call>{W}</tool_call>\n\nDone. ", "Done. ", [WEATHER]),
    ("No tools needed. <b>bold</b> a < b", "No tools needed. <b>bold</b> a < b", []),
    ("<tool_call>\n{not json}\n</tool_call>", "<tool_call>\n{not json}\n</tool_call>", []),
    (
        f'Hi <tool_call>{{"name": "rm_rf", "arguments": {{}}}}</tool_call> <tool_call>{T}</tool_call>',
        'Hi <tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
        [TIME],
    ),
    ('<tool_call>{"name": "get_time", "arguments": "{}"}</tool_call>', None, []),
    ('<tool_call>["get_time"]</tool_call>', None, []),
    ('<tool_call>{"arguments": {}}</tool_call>', None, []),
    ('<tool_call>{"name": "get_time"}</tool_call>', "", [TIME]),
    (f"<tool_call>\n{W}", None, []),  # never closed
    (f"<tool_call>{W}</tool_call> <tool_call>{W}", f"<tool_call>{W}", [WEATHER]),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich 北京"}}</tool_call>', "", None),
    ("text ending in a partial marker <tool_ca", None, []),
    ("plain text, trailing whitespace kept \n", None, []),
    ("", "", []),
]

LLAMA_CASES: list[tuple[str, str, list[tuple[str, str]]]] = [
    ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}', "", [WEATHER]),
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}', "", [WEATHER]),
    (f'\n {{"name": "get_time", "parameters": {{}}}}; {W}', "", [TIME, WEATHER]),
    (f"<|python_tag|>{T};{T};", "", [TIME, TIME]),
    ('{"name": "get_time", "parameters": {"note": "a;b}"}}', "", [("get_time", '{"note":"a;b}"}')]),
    ("The weather in Paris is sunny.", None, []),
    ('Sure: {"name": "get_time", "parameters": {}}', None, []),
    ('{"answer": 42}', None, []),  # a JSON answer, not a call
    ('{"name": "rm_rf", "parameters": {}}', None, []),
    (f'{T}; {{"name": "rm_rf", "parameters": {{}}}}', None, []),  # all or nothing
    (f"{T} and some text", None, []),
    ('{"name": "get_time", "parameters": [1]}', None, []),
    ("{broken", None, []),
    ('<|python_tag|>brave_search.call(query="x")', None, []),
    ("<|python", None, []),
    ("", "", []),
]


def _check_whole(parser_name: str, text: str, content: str | None, expected: list | None) -> None:
    delta = parse(parser_name, text, NAMES)
    assert delta.content == (text if content is None else content)
    if expected is not None:
        assert calls(delta) == expected


@pytest.mark.parametrize(("text", "content", "expected"), QWEN_CASES)
def test_qwen25_whole_text(text: str, content: str | None, expected: list | None) -> None:
    _check_whole("qwen25", text, content, expected)


@pytest.mark.parametrize(("text", "content", "expected"), LLAMA_CASES)
def test_llama3_whole_text(text: str, content: str | None, expected: list | None) -> None:
    _check_whole("llama3", text, content, expected)


@pytest.mark.parametrize(
    ("parser_name", "text"),
    [("qwen25", t) for t, _, _ in QWEN_CASES] + [("llama3", t) for t, _, _ in LLAMA_CASES],
)
def test_streaming_equals_whole_text_for_every_chunking(parser_name: str, text: str) -> None:
    whole = parse(parser_name, text, NAMES)
    for chunks in chunkings(text):
        got = stream(parser_name, chunks)
        assert (got.content, calls(got)) == (whole.content, calls(whole)), chunks


def test_unicode_arguments_stay_unescaped_and_compact() -> None:
    delta = parse(
        "qwen25", '<tool_call>{"name": "get_weather", "arguments": {"city": "北京"}}</tool_call>', NAMES
    )
    assert delta.calls[0].arguments == '{"city":"北京"}'


def test_call_ids() -> None:
    ids = [
        c.id for c in parse("qwen25", f"<tool_call>{T}</tool_call><tool_call>{T}</tool_call>", NAMES).calls
    ]
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids)
    assert len(set(ids)) == 2


def test_qwen25_streams_content_and_calls_early() -> None:
    p = TOOL_PARSERS["qwen25"](NAMES)
    assert p.feed("Checking") == ToolDelta(content="Checking")
    assert p.feed(" now <tool") == ToolDelta(content=" now")  # trailing space held: a call may follow
    assert p.feed(f"_call>{W}</tool_ca") == ToolDelta()
    delta = p.feed("ll>\n")
    assert delta.content == "" and calls(delta) == [WEATHER]  # emitted when its block completes
    assert p.feed("<tool_call>{bad}</tool_call>") == ToolDelta(content="<tool_call>{bad}</tool_call>")
    assert p.finish() == ToolDelta()


def test_llama3_holds_calls_until_finish_and_streams_plain_content() -> None:
    p = TOOL_PARSERS["llama3"](NAMES)
    assert p.feed("<|python_tag|>") == ToolDelta()
    assert p.feed(T) == ToolDelta()
    assert calls(p.finish()) == [TIME]
    p = TOOL_PARSERS["llama3"](NAMES)
    assert p.feed(" <|py") == ToolDelta()
    assert p.feed("thon is fun") == ToolDelta(content=" <|python is fun")
    assert p.feed(" {") == ToolDelta(content=" {")
    assert p.finish() == ToolDelta()


def test_detect_tool_parser() -> None:
    assert detect_tool_parser("{{- '<tool_call>\\n' }}{{ tool_call | tojson }}") == "qwen25"
    assert detect_tool_parser("{{- '<|python_tag|>' + tool_call.name }}") == "llama3"
    llama32 = '<|start_header_id|>user<|end_header_id|>{% for t in tools %}"parameters": ...{% endfor %}'
    assert detect_tool_parser(llama32) == "llama3"
    assert detect_tool_parser("<|start_header_id|>{{ message['content'] }}") is None
    assert detect_tool_parser(None) is None


# Forced tool choice.

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time"}}
TOOLS = [WEATHER_TOOL, TIME_TOOL]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def llguidance_accepts(schema: dict) -> bool:
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    # Some llguidance versions return (is_error, messages) here; 1.x returns the error text ("" if none).
    result: Any = llguidance.LLMatcher.validate_grammar(grammar)
    is_error = result[0] if isinstance(result, tuple) else bool(result)
    return not is_error


def valid(schema: dict, value: Any) -> bool:
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def test_llguidance_check_is_not_vacuous() -> None:
    assert not llguidance_accepts({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}})


def test_required_schema_single_call() -> None:
    schema = forced_schema(TOOLS, "required", parallel=False)
    assert llguidance_accepts(schema)
    assert valid(schema, [{"name": "get_weather", "arguments": {"city": "Paris"}}])
    assert valid(schema, [{"name": "get_time", "arguments": {}}])
    assert valid(schema, [{"name": "get_time", "arguments": {"anything": 1}}])
    bad = [
        [],
        {"name": "get_time", "arguments": {}},
        [{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {}}],
        [{"name": "get_date", "arguments": {}}],
        [{"name": "get_weather", "arguments": {}}],
        [{"name": "get_weather", "arguments": {"city": 3}}],
        [{"name": "get_weather", "arguments": {"city": "Paris", "units": "C"}}],
        [{"name": "get_time"}],
        [{"name": "get_time", "arguments": {}, "extra": 1}],
        [{"name": "get_time", "arguments": []}],
    ]
    for value in bad:
        assert not valid(schema, value), value


def test_required_schema_parallel() -> None:
    schema = forced_schema(TOOLS, "required", parallel=True)
    assert "maxItems" not in schema and schema["minItems"] == 1
    assert llguidance_accepts(schema)
    two = [{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]
    assert valid(schema, two)
    assert not valid(schema, [])


def test_named_schema_is_the_function_parameters() -> None:
    schema = forced_schema(TOOLS, NAMED, parallel=False)
    assert schema == WEATHER_TOOL["function"]["parameters"]
    assert llguidance_accepts(schema)
    assert valid(schema, {"city": "Paris", "days": 3})
    assert not valid(schema, {"days": 3})
    assert not valid(schema, ["Paris"])
    empty = forced_schema(TOOLS, {"type": "function", "function": {"name": "get_time"}}, parallel=False)
    assert empty == {"type": "object", "properties": {}}
    assert llguidance_accepts(empty) and valid(empty, {}) and not valid(empty, "x")


def test_required_schema_keeps_local_refs_working() -> None:
    params = {
        "type": "object",
        "properties": {"where": {"$ref": "#/$defs/place"}},
        "required": ["where"],
        "$defs": {
            "place": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        },
    }
    tools = [TIME_TOOL, {"type": "function", "function": {"name": "go", "parameters": params}}]
    schema = forced_schema(tools, "required", parallel=True)
    assert llguidance_accepts(schema)
    assert valid(schema, [{"name": "go", "arguments": {"where": {"city": "Oslo"}}}])
    assert not valid(schema, [{"name": "go", "arguments": {"where": {"city": 1}}}])
    named = forced_schema(tools, {"type": "function", "function": {"name": "go"}}, parallel=False)
    assert named == params and llguidance_accepts(named)


def test_parse_forced_round_trips() -> None:
    out = parse_forced(
        '[{"name": "get_weather", "arguments": {"city": "Köln"}}, {"name": "get_time", "arguments": {}}]',
        "required",
    )
    assert [(c.name, c.arguments) for c in out] == [("get_weather", '{"city":"Köln"}'), ("get_time", "{}")]
    assert all(isinstance(c, ToolCall) and c.id.startswith("call_") for c in out)
    (one,) = parse_forced(' {"city": "Paris", "days": 2} ', NAMED)
    assert (one.name, one.arguments) == WEATHER
    value = [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]
    schema = forced_schema(TOOLS, "required", parallel=False)
    assert valid(schema, value)
    assert [(c.name, c.arguments) for c in parse_forced(json.dumps(value), "required")] == [WEATHER]


@pytest.mark.parametrize(
    ("text", "choice", "message"),
    [
        ("[{", "required", "not valid JSON"),
        ('{"name": "get_time", "arguments": {}}', "required", "non-empty JSON array"),
        ("[]", "required", "non-empty JSON array"),
        ('[{"arguments": {}}]', "required", "string 'name'"),
        ('[{"name": "get_time", "arguments": "{}"}]', "required", "'arguments' object"),
        ('["get_time"]', "required", "string 'name'"),
        ('"Paris"', NAMED, "must be a JSON object"),
        ("{}", "auto", "does not force"),
    ],
)
def test_parse_forced_rejects(text: str, choice: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_forced(text, choice)


def test_check_tools_accepts_valid_requests() -> None:
    for choice in (None, "none", "auto", "required", NAMED):
        check_tools(TOOLS, choice)
    check_tools(None, None)
    check_tools([], "none")
    check_tools([], "auto")


def _fn(name: Any = "f", **extra: Any) -> dict:
    return {"type": "function", "function": {"name": name, **extra}}


@pytest.mark.parametrize(
    ("tools", "choice", "message"),
    [
        ([{"type": "code_interpreter"}], "auto", "type must be 'function'"),
        (["get_time"], "auto", "type must be 'function'"),
        ([{"type": "function"}], "auto", "function must be an object"),
        ([{"type": "function", "function": {}}], "auto", "name must be a non-empty string"),
        ([_fn("")], "auto", "name must be a non-empty string"),
        ([_fn(7)], "auto", "name must be a non-empty string"),
        ([_fn("get weather")], "auto", "must match"),
        ([_fn("x" * 65)], "auto", "must match"),
        ([_fn("f\n")], "auto", "must match"),
        ([_fn(), _fn()], "auto", "duplicate function name 'f'"),
        ([_fn(parameters="{}")], "auto", "parameters must be a JSON object"),
        ([_fn(parameters=[])], "auto", "parameters must be a JSON object"),
        ([_fn(description=3)], "auto", "description must be a string"),
        (TOOLS, {"type": "function", "function": {"name": "get_date"}}, "'get_date', which is not in tools"),
        ([], {"type": "function", "function": {"name": "f"}}, "no tools were given"),
        (None, "required", "'required' needs at least one tool"),
        (TOOLS, "any", "'any' is not one of"),
        (TOOLS, {"type": "function"}, "tool_choice.function.name"),
        (TOOLS, {"type": "custom", "custom": {"name": "f"}}, "tool_choice must be"),
        (TOOLS, 1, "tool_choice must be"),
    ],
)
def test_check_tools_errors(tools: Any, choice: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        check_tools(tools, choice)

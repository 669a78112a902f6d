"""Forced tool choice: `tool_choice` "required" or a named function, enforced with a JSON-schema grammar.

With "required" the model writes a JSON array of `{"name": ..., "arguments": {...}}` (one element unless
parallel calls are allowed); with a named function it writes that function's arguments object alone.
`parse_forced` turns either back into ToolCalls. `check_tools` validates a request's tools and choice.
"""

from __future__ import annotations

import json
import re
from typing import Any

from skiff.server.tool_calls import ToolCall, compact_json, new_call_id

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_CHOICES = ("none", "auto", "required")
# Keywords whose values are data, not subschemas: a "$ref" key inside them is not a reference.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def _params(tool: dict) -> dict:
    params = tool["function"].get("parameters")
    if not params:
        return {"type": "object", "properties": {}}
    if "type" not in params:
        params = {**params, "type": "object"}  # arguments are always an object
    return params


def _rebase_refs(schema: Any, base: str) -> Any:
    """`schema` with its local references ("#", "#/...") made relative to the pointer `base`, for
    embedding it below the root of another schema."""
    if isinstance(schema, list):
        return [_rebase_refs(s, base) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and (value == "#" or value.startswith("#/")):
            out[key] = base + value[1:]
        elif key in _DATA_KEYWORDS:
            out[key] = value
        else:
            out[key] = _rebase_refs(value, base)
    return out


def _choice_name(choice: str | dict) -> str | None:
    """The function a named choice forces, or None for a string choice."""
    if isinstance(choice, dict):
        function = choice.get("function")
        return function.get("name") if isinstance(function, dict) else None
    return None


def forced_schema(tools: list[dict], choice: str | dict, parallel: bool) -> dict:
    """The JSON schema the output must follow for a forced `choice` (call `check_tools` first)."""
    if choice == "required":
        variants = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": tool["function"]["name"]},
                    "arguments": _rebase_refs(_params(tool), f"#/items/anyOf/{n}/properties/arguments"),
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for n, tool in enumerate(tools)
        ]
        schema: dict[str, Any] = {"type": "array", "items": {"anyOf": variants}, "minItems": 1}
        if not parallel:
            schema["maxItems"] = 1
        return schema
    name = _choice_name(choice)
    for tool in tools:
        if tool["function"]["name"] == name:
            return _params(tool)
    raise ValueError(f"tool_choice {choice!r} does not force a declared function")


def parse_forced(text: str, choice: str | dict) -> list[ToolCall]:
    """The calls in output generated under `forced_schema(..., choice, ...)`."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"forced tool call output is not valid JSON: {e}") from None
    if choice == "required":
        if not isinstance(value, list) or not value:
            raise ValueError("forced tool call output must be a non-empty JSON array of calls")
        calls = []
        for n, item in enumerate(value):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise ValueError(f"forced tool call {n} must be an object with a string 'name'")
            if not isinstance(item.get("arguments"), dict):
                raise ValueError(f"forced tool call {n} ({item['name']}) must have an 'arguments' object")
            calls.append(ToolCall(new_call_id(), item["name"], compact_json(item["arguments"])))
        return calls
    name = _choice_name(choice)
    if not isinstance(name, str):
        raise ValueError(f"tool_choice {choice!r} does not force a tool call")
    if not isinstance(value, dict):
        raise ValueError(f"forced arguments for {name} must be a JSON object")
    return [ToolCall(new_call_id(), name, compact_json(value))]


def _check_tool(n: int, tool: Any) -> str:
    where = f"tools[{n}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise ValueError(f"{where}: type must be 'function', got {kind!r}")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ValueError(f"{where}.function must be an object")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.function.name must be a non-empty string")
    if not _NAME.fullmatch(name):
        raise ValueError(f"{where}.function.name {name!r} must match ^[a-zA-Z0-9_-]{{1,64}}$")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ValueError(f"{where}.function.description must be a string")
    params = function.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"{where}.function.parameters must be a JSON object (a JSON schema)")
    return name


def check_tools(tools: list[dict] | None, choice: str | dict | None) -> None:
    """Raise ValueError naming the first problem with a request's `tools` and `tool_choice`."""
    tools = tools or []
    if not isinstance(tools, list):
        raise ValueError("tools must be a list")
    names: set[str] = set()
    for n, tool in enumerate(tools):
        name = _check_tool(n, tool)
        if name in names:
            raise ValueError(f"tools[{n}]: duplicate function name {name!r}")
        names.add(name)
    if choice is None or choice in ("none", "auto"):
        return
    if isinstance(choice, str):
        if choice != "required":
            raise ValueError(f"tool_choice {choice!r} is not one of {', '.join(_CHOICES)} or a function")
        if not tools:
            raise ValueError("tool_choice 'required' needs at least one tool in tools")
        return
    if not isinstance(choice, dict) or choice.get("type") != "function":
        raise ValueError("tool_choice must be a string or {'type': 'function', 'function': {'name': ...}}")
    name = _choice_name(choice)
    if not isinstance(name, str) or not name:
        raise ValueError("tool_choice.function.name must be a non-empty string")
    if not tools:
        raise ValueError(f"tool_choice names function {name!r} but no tools were given")
    if name not in names:
        raise ValueError(f"tool_choice names function {name!r}, which is not in tools")

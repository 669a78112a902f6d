"""OpenAI request bodies, validated strictly: wrong types, out-of-range values and unknown fields are 400s.

Beyond OpenAI's own fields we accept the extensions SGLang and vLLM clients send (top_k, min_p,
repetition_penalty, ignore_eos, stop_token_ids, skip_special_tokens, chat_template_kwargs, ...).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from skiff.constrained.grammar import Grammar, json_object
from skiff.server.messages import Prompt, TextPrompt, TokenIdsPrompt

MAX_STOP = 16


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextFormat(_Strict):
    type: Literal["text"]


class JsonObjectFormat(_Strict):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaResponseFormat, Field(discriminator="type")
]


class _Sampling(_Strict):
    model: str | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # extensions
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    priority: int = 0
    # structured outputs: OpenAI's response_format, or one of SGLang's grammar fields
    response_format: ResponseFormat | None = None
    regex: str | None = Field(None, min_length=1)
    ebnf: str | None = Field(None, min_length=1)
    json_schema: str | None = Field(None, min_length=1)  # a JSON schema as JSON text (SGLang's field)

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        items = [v] if isinstance(v, str) else (v or [])
        if len(items) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences are allowed")
        if any(not s for s in items):
            raise ValueError("stop sequences must be non-empty strings")
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _check_stop_ids(cls, v: list[int] | None) -> list[int] | None:
        if v and any(t < 0 for t in v):
            raise ValueError("stop_token_ids must be non-negative")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v:
            raise ValueError("logit_bias is not supported")
        return v

    @model_validator(mode="after")
    def _check_stream_options(self) -> _Sampling:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @model_validator(mode="after")
    def _one_grammar(self) -> _Sampling:
        given = [name for name in ("regex", "ebnf", "json_schema") if getattr(self, name) is not None]
        if self.response_format is not None and self.response_format.type != "text":
            given.append("response_format")
        if len(given) > 1:
            raise ValueError(f"at most one of response_format, regex, ebnf, json_schema: got {given}")
        return self

    def grammar(self) -> Grammar | None:
        """The constraint the output must match, if any (compiled and checked by the API, not here)."""
        fmt = self.response_format
        if isinstance(fmt, JsonObjectFormat):
            return json_object()
        if isinstance(fmt, JsonSchemaResponseFormat):
            schema = fmt.json_schema.schema_
            return Grammar("json_schema", json.dumps(schema if schema is not None else {}))
        if self.json_schema is not None:
            return Grammar("json_schema", self.json_schema)
        if self.regex is not None:
            return Grammar("regex", self.regex)
        if self.ebnf is not None:
            return Grammar("ebnf", self.ebnf)
        return None

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def base_params(self) -> dict[str, Any]:
        """SamplingParams fields shared by both endpoints (None: the engine's default)."""
        p: dict[str, Any] = {
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "top_k": -1 if self.top_k is None else self.top_k,
            "min_p": self.min_p or 0.0,
            "presence_penalty": self.presence_penalty or 0.0,
            "frequency_penalty": self.frequency_penalty or 0.0,
            "repetition_penalty": 1.0 if self.repetition_penalty is None else self.repetition_penalty,
            "ignore_eos": self.ignore_eos,
            "stop_token_ids": list(self.stop_token_ids or []),
            "skip_special_tokens": self.skip_special_tokens,
            "priority": self.priority,
        }
        return p


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(None, ge=1)
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError("prompt must not be an empty list")
            if isinstance(v[0], list) and any(not p for p in v):
                raise ValueError("a token-id prompt must not be empty")
        elif v == "":
            raise ValueError("prompt must not be empty")
        return v

    @model_validator(mode="after")
    def _check_unsupported(self) -> CompletionRequest:
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.echo:
            raise ValueError("echo is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of other than n is not supported")
        return self

    def prompts(self) -> list[Prompt]:
        p = self.prompt
        if isinstance(p, str):
            return [TextPrompt(p)]
        if isinstance(p[0], str):
            return [TextPrompt(s) for s in p]  # type: ignore[misc]
        if isinstance(p[0], int):
            return [TokenIdsPrompt(list(p))]  # type: ignore[arg-type]
        return [TokenIdsPrompt(list(x)) for x in p]  # type: ignore[union-attr]


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class AssistantToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[AssistantToolCall] | None = None
    reasoning_content: str | None = None  # sent back by clients; not part of the prompt

    @field_validator("content", mode="before")
    @classmethod
    def _only_text(cls, v: Any) -> Any:
        if isinstance(v, list):
            for part in v:
                if isinstance(part, dict) and part.get("type") not in (None, "text"):
                    raise ValueError(
                        f"content parts of type {part.get('type')!r} are not supported (text only)"
                    )
        return v

    @model_validator(mode="after")
    def _needs_content(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        return self

    def for_template(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "".join(p.text for p in content)
        msg: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": content or "",
        }
        if self.name:
            msg["name"] = self.name
        if self.tool_call_id:
            msg["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            # templates render arguments with `tojson` (Llama) or as a mapping: give them the object
            msg["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": _json_or_text(c.function.arguments)},
                }
                for c in self.tool_calls
            ]
        return msg


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None  # checked by tool_choice.check_tools
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    separate_reasoning: bool = True  # SGLang's: reasoning_content apart from content
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    modalities: list[Literal["text"]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        return self

    def effective_tool_choice(self) -> str | dict[str, Any]:
        return self.tool_choice if self.tool_choice is not None else ("auto" if self.tools else "none")

    def completion_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

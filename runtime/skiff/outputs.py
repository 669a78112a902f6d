"""What the engine reports back, per scheduler step and per finished request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass
class StepOutput:
    """New tokens of one request produced by one engine step (usually one token)."""

    rid: str
    token_ids: list[int]
    logprobs: list[float] | None = None  # logprob of each chosen token, when asked for
    top_logprobs: list[dict[int, float]] | None = None  # top-n alternatives per token, when asked for
    finish_reason: FinishReason | None = None
    matched_stop: int | str | None = None  # the stop token id or stop string that ended it
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    completion_tokens: int = 0  # total generated so far
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class RequestTiming:
    """When one request reached its milestones inside the engine, as wall-clock epoch ns (`time.time_ns`,
    comparable across the pod's processes): reported once, in the step that produced its first token."""

    rid: str
    queued: int  # it began to wait for the engine: tokenized (the server's tokenizer) or added (offline)
    scheduled: int  # first put in a batch: its prefill began
    first_token: int  # its first token was sampled and on the host


@dataclass
class RequestOutput:
    """A finished request of the offline API."""

    rid: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    logprobs: list[float] | None = None
    top_logprobs: list[dict[int, float]] | None = None
    cached_tokens: int = 0

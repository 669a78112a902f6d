"""Every message between the pod's processes, one frozen msgspec Struct each, tagged by its class name.

A request's path, by type:

    API          --TokenizeRequest-->     tokenizer
    tokenizer    --TokenizedRequest-->    scheduler (the engine)
    scheduler    --DecodeRegistration, StepTokens-->  detokenizer
    detokenizer  --DetokenizedChunks-->   API
    API, detokenizer (stop string)  --AbortRequest-->  scheduler

and the pod's own traffic: every child's `*Ready` (or `ChildFailed`) once, the scheduler's `SchedulerStats`
heartbeat, `RequestFailed` for a request rejected before it ran, `IntegrityCheck` -> `IntegrityReport`, and
`Shutdown`. The unions at the end say which types each process's inbox accepts.
"""

from __future__ import annotations

from typing import Any

import msgspec

from skiff.engine.stats import EngineStats
from skiff.outputs import FinishReason, RequestTiming, StepOutput
from skiff.params import SamplingParams


class Message(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """Base of every inter-process message: encoded as [class name, field, ...]."""


# --- prompts and per-request options (parts of messages) -------------------------------------------
class TextPrompt(msgspec.Struct, frozen=True, tag="text"):
    text: str


class TokenIdsPrompt(msgspec.Struct, frozen=True, tag="ids"):
    ids: list[int]


class ChatPrompt(msgspec.Struct, frozen=True, tag="chat"):
    messages: list[dict[str, Any]]
    template_kwargs: dict[str, Any] = {}


Prompt = TextPrompt | TokenIdsPrompt | ChatPrompt


class DecodeOptions(msgspec.Struct, frozen=True):
    """What the detokenizer needs to know about a request: text-level options the engine never sees."""

    stop: list[str] = []
    skip_special_tokens: bool = True
    logprobs: bool = False


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    token: str
    logprob: float
    top: list[tuple[str, float]]  # the most likely alternatives, as (token, logprob)


# --- the request path ------------------------------------------------------------------------------
class TokenizeRequest(Message):
    """API -> tokenizer: one prompt, fanned out to one engine request per rid."""

    rids: list[str]
    prompt: Prompt
    sampling: list[SamplingParams]  # one per rid (seeds differ); max_tokens is set by the scheduler
    max_tokens: int | None  # the client's budget; None: whatever the context leaves after the prompt
    decode: DecodeOptions
    owner: int = 0  # the API worker waiting for the outputs (its index in Endpoints.api)


class TokenizedRequest(Message):
    """Tokenizer -> scheduler: one engine request."""

    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    max_tokens: int | None
    decode: DecodeOptions
    owner: int = 0
    tokenized: int = 0  # epoch ns the tokenizer finished: when it began to wait for the engine


class AbortRequest(Message):
    """API (client gone) or detokenizer (stop string matched) -> scheduler."""

    rid: str


class DecodeRegistration(Message):
    """Scheduler -> detokenizer, before the request's first tokens and on the same pipe as them."""

    rid: str
    options: DecodeOptions
    owner: int = 0  # the API worker its chunks go to


class StepTokens(Message):
    """Scheduler -> detokenizer: the new token ids of one engine step."""

    outputs: list[StepOutput]
    timings: list[RequestTiming] = []  # of the requests whose first token is in `outputs`


class DetokenizedChunk(msgspec.Struct, frozen=True, array_like=True):
    """One detokenized update of one engine request."""

    rid: str
    text: str
    n_tokens: int
    logprobs: list[TokenLogprob] | None
    finish_reason: FinishReason | None
    matched_stop: int | str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    error: str | None
    timing: RequestTiming | None = None  # on the request's first chunk only: the engine's milestones

    def then(self, later: DetokenizedChunk) -> DetokenizedChunk:
        """This chunk and the same request's next one as one (the later one's counts and finish win)."""
        logprobs = (
            None
            if self.logprobs is None and later.logprobs is None
            else [*(self.logprobs or []), *(later.logprobs or [])]
        )
        return msgspec.structs.replace(
            later,
            text=self.text + later.text,
            n_tokens=self.n_tokens + later.n_tokens,
            logprobs=logprobs,
            timing=self.timing or later.timing,
        )


class DetokenizedChunks(Message):
    """Detokenizer -> API: every chunk of one detokenizer pass."""

    chunks: list[DetokenizedChunk]


class RequestFailed(Message):
    """Tokenizer or scheduler -> API: a request rejected before it ran (status is the HTTP status)."""

    rid: str
    status: int
    message: str


# --- the pod's own traffic -------------------------------------------------------------------------
class TokenizerReady(Message):
    who: str
    probe_ids: list[int]  # a short prompt /health_generate can send
    vocab_size: int
    tool_parser: str | None  # the chat template's tool-call format (tool_calls.TOOL_PARSERS)
    reasoning_parser: str | None  # ... and its thinking format (reasoning.REASONING_PARSERS)


class DetokenizerReady(Message):
    who: str = "detokenizer"  # "detokenizer-<i>" when there are several


class EngineReady(Message):
    max_context_len: int
    eos_token_ids: list[int]
    rank_pids: list[int]  # the engine's TP ranks: the API process ends them if the scheduler dies first
    stats: EngineStats
    who: str = "scheduler"


class ChildFailed(Message):
    """Any child -> API: it could not start, or its loop crashed; the pod is done."""

    who: str
    message: str


class SchedulerStats(Message):
    """Scheduler -> API, twice a second and whenever the engine goes idle: also the heartbeat."""

    engine: EngineStats | None  # None: none reported yet
    gen_throughput: float  # generated tokens per second, smoothed


class IntegrityCheck(Message):
    """API -> scheduler: run the engine's page-accounting check."""

    id: int
    owner: int = 0  # the API worker the report goes to


class IntegrityReport(Message):
    id: int
    ok: bool
    error: str | None
    stats: EngineStats
    live: int  # requests the scheduler holds


class Shutdown(Message):
    """API -> a child: stop (the scheduler stops the engine and its TP ranks first)."""


ToTokenizer = TokenizeRequest | Shutdown
ToScheduler = TokenizedRequest | AbortRequest | IntegrityCheck | Shutdown
ToDetokenizer = DecodeRegistration | StepTokens | Shutdown
ToApi = (
    TokenizerReady
    | DetokenizerReady
    | EngineReady
    | ChildFailed
    | SchedulerStats
    | RequestFailed
    | DetokenizedChunks
    | IntegrityReport
)

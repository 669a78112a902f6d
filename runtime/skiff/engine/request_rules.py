"""The rules every engine applies to a request: its context limit, its prompt's admission, when it ends."""

from __future__ import annotations

from skiff.config import EngineConfig
from skiff.models import ModelConfig
from skiff.outputs import FinishReason
from skiff.params import InvalidRequest, SamplingParams


def context_limit(cfg: EngineConfig, model_cfg: ModelConfig) -> int:
    """Prompt plus output, in tokens: the configured context length, never past the model's."""
    return min(cfg.context_length or model_cfg.max_position, model_cfg.max_position)


def check_prompt(input_ids: list[int], max_context_len: int, vocab_size: int, kv_capacity: int) -> None:
    """Raises InvalidRequest for a prompt no step could run: empty, too long, unknown ids, over the pool."""
    if not input_ids:
        raise InvalidRequest("the prompt is empty: at least one token is required")
    if len(input_ids) >= max_context_len:
        raise InvalidRequest(
            f"the prompt has {len(input_ids)} tokens, but the context length is "
            f"{max_context_len} (prompt plus at least one generated token)"
        )
    if any(not 0 <= t < vocab_size for t in input_ids):
        raise InvalidRequest(f"prompt token ids must be in [0, {vocab_size})")
    if len(input_ids) >= kv_capacity:
        raise InvalidRequest(
            f"the prompt has {len(input_ids)} tokens, more than the KV cache holds ({kv_capacity})"
        )


def finish_reason(
    p: SamplingParams, token: int, eos_token_ids: list[int], prompt_len: int, num_output: int, limit: int
) -> FinishReason | None:
    """Why a request ends with `token`, its num_output-th output token, or None while it goes on."""
    if (token in eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
        return "stop"
    if num_output >= p.max_tokens or prompt_len + num_output >= limit:
        return "length"
    return None

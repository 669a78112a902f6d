"""The checks every engine runs on a new request's prompt before it queues."""

from __future__ import annotations

from skiff.params import InvalidRequest


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

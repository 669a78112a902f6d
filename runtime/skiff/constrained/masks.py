"""Token masks for constrained requests, applied inside the batched sampler.

Each constrained request owns an llguidance matcher that has consumed its output so far. Before a batch is
sampled, the matchers of its constrained rows fill one int32 bitmask on the host (in parallel, without the
GIL, while the device still runs the batch's forward), which masks those rows' logits to -inf wherever a
token is not allowed. The engine feeds every sampled token back (`advance`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from skiff.constrained.grammar import Grammar, GrammarError, compiled
from skiff.engine.sampler import to_device
from skiff.params import InvalidRequest

log = logging.getLogger(__name__)


@dataclass
class GrammarMasks:
    """The engine's grammar state shared by every request: the tokenizer view and a thread pool."""

    tokenizer_path: str
    vocab_size: int  # the logits' width, which may exceed the tokenizer's own vocabulary
    eos_token_ids: list[int]
    _tokenizer: Any = field(default=None, repr=False)
    _executor: Any = field(default=None, repr=False)
    _buffer: torch.Tensor | None = field(default=None, repr=False)

    def _ll_tokenizer(self) -> Any:
        if self._tokenizer is None:  # ~1 s: once per engine, on the first constrained request
            import llguidance
            import llguidance.hf

            from skiff.tokenizer import load_tokenizer

            hf = load_tokenizer(self.tokenizer_path)
            self._tokenizer = llguidance.hf.from_tokenizer(
                hf, n_vocab=self.vocab_size, eos_token=self.eos_token_ids or None
            )
            self._executor = llguidance.LLExecutor()
        return self._tokenizer

    def matcher(self, grammar: Grammar) -> Any:
        import llguidance

        # The API validated it already; a matcher in error says the same for offline callers.
        try:
            source = compiled(grammar)
        except GrammarError as e:
            raise InvalidRequest(str(e)) from e
        m = llguidance.LLMatcher(self._ll_tokenizer(), source, log_level=0)
        if m.is_error():
            raise InvalidRequest(f"the {grammar.kind} grammar does not compile: {m.get_error()}")
        return m

    def masked(self, logits: torch.Tensor, matchers: list[Any | None]) -> torch.Tensor:
        """logits (a new tensor) with each constrained row's disallowed tokens at -inf."""
        rows = [i for i, m in enumerate(matchers) if m is not None]
        if not rows:
            return logits
        bitmask = self._bitmask(len(rows), logits.is_cuda)
        words = bitmask.shape[1]
        # llguidance.torch wraps this call, but importing it compiles a kernel through torch._dynamo (~4 s)
        self._executor.unsafe_compute_mask_ptr(
            [(matchers[i], k) for k, i in enumerate(rows)], bitmask.data_ptr(), words * 4, len(rows)
        )
        allowed = unpack_bitmask(bitmask.to(logits.device, non_blocking=True), logits.shape[-1])
        out = logits.clone()  # an inference tensor (and maybe a CUDA graph's output): not updated in place
        index = to_device(rows, logits.device, torch.int64)  # no stream sync on CUDA
        out[index] = out[index].masked_fill(~allowed, float("-inf"))
        return out

    def _bitmask(self, rows: int, pinned: bool) -> torch.Tensor:
        """A reused host buffer: the previous step's copy out of it is done (its tokens were read)."""
        buf = self._buffer
        if buf is None or buf.shape[0] < rows:
            words = -(-self.vocab_size // 32)
            buf = self._buffer = torch.empty((max(rows, 16), words), dtype=torch.int32, pin_memory=pinned)
        return buf[:rows]


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, ceil(V/32)] int32 (bit j of word w: token 32w + j) -> [rows, V] bool."""
    shifts = _SHIFTS.get(bitmask.device)
    if shifts is None:
        shifts = _SHIFTS[bitmask.device] = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab].bool()


def advance(matcher: Any, token: int) -> bool:
    """Feed a sampled token; True when the grammar is complete (the request ends with finish "stop")."""
    if not matcher.consume_token(token):
        # the mask allowed only tokens the matcher accepts, so this is an engine bug: end, do not loop
        log.error("a constrained request sampled a token its grammar rejects: %s", matcher.get_error())
        return True
    return matcher.is_stopped()

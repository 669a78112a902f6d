"""How far two correct runs of the same weights disagree: the floor under the teacher-forced agreement bar.

Each control compares two computations that differ only in kernels or in the order of fp32 sums, never in
the model: HF's decode path (greedy generate with its KV cache) against HF's prefill over the same tokens,
HF's SDPA backends against each other (all accumulate in fp32), and Skiff's decode against Skiff's prefill.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Preds = list[torch.Tensor]
Agreement = Callable[[list[list[int]], Preds], tuple[float, float, float]]


def hf_greedy(hf: Any, prompts: list[list[int]], n_new: int, device: str) -> list[list[int]]:
    """HF's own greedy tokens through `generate` (one query per step against its KV cache)."""
    outs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p], device=device)
            g = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n_new,
                min_new_tokens=n_new,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                pad_token_id=0,
            )
            outs.append(g[0, len(p) :].tolist())
    return outs


def sdpa_backends(device: str) -> list[tuple[str, Any]]:
    from torch.nn.attention import SDPBackend

    if device == "cpu":
        return [("math", SDPBackend.MATH)]
    return [
        ("math", SDPBackend.MATH),
        ("mem_efficient", SDPBackend.EFFICIENT_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
    ]


def floor_section(
    hf: Any,
    prompts: list[list[int]],
    n_new: int,
    device: str,
    skiff_tokens: list[list[int]],
    skiff_prefill: Preds,
    hf_preds: Callable[[list[list[int]]], Preds],
    hf_sdpa_preds: Preds,
    agreement: Agreement,
) -> dict[str, Any]:
    """hf_sdpa_preds: HF (default SDPA) teacher-forced over skiff_tokens; skiff_prefill: Skiff's prefill logits
    over prompt + skiff_tokens, the rows that predict skiff_tokens. A control that cannot run (an SDPA backend
    without a kernel for these shapes) records its error and the others still run."""
    from torch.nn.attention import sdpa_kernel

    res: dict[str, Any] = {}

    def control(name: str, fn: Callable[[], tuple[float, float, float]]) -> None:
        try:
            res[name] = fn()
        except Exception as exc:  # noqa: BLE001 - recorded, the next control still runs
            res[name] = {"error": repr(exc)}

    def hf_decode() -> tuple[float, float, float]:
        own = hf_greedy(hf, prompts, n_new, device)
        return agreement(own, hf_preds(own))

    def backend_vs_default(backend: Any) -> tuple[float, float, float]:
        with sdpa_kernel(backend):
            other = hf_preds(skiff_tokens)
        return agreement([p.argmax(-1).tolist() for p in other], hf_sdpa_preds)

    control("skiff_decode_vs_skiff_prefill", lambda: agreement(skiff_tokens, skiff_prefill))
    control(
        "skiff_prefill_vs_hf_prefill",
        lambda: agreement([p.argmax(-1).tolist() for p in skiff_prefill], hf_sdpa_preds),
    )
    for name, backend in sdpa_backends(device):
        control(f"hf_sdpa_{name}_vs_hf_sdpa_default", lambda b=backend: backend_vs_default(b))
    control("hf_decode_vs_hf_prefill", hf_decode)
    return res

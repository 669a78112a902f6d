"""Fused ops: RMSNorm, fused add+RMSNorm, rotary embedding, SiLU-and-mul.

On CUDA they come from one of two providers, chosen by `SKIFF_FUSED_OPS`:
  triton      (default) Skiff's Triton kernels (skiff.kernels.triton_ops), one kernel per op that rounds
              where the HF reference rounds, so bf16 logits track HF's;
  flashinfer  FlashInfer's kernels: fp32 inside, one rounding per op.
On CPU (fp32) they come from Skiff's own C++ kernels (skiff.kernels.cpu). The layers call these only where
`enabled(x)` holds and keep their torch versions otherwise (other dtypes, no provider, no C++ compiler).
`SKIFF_DISABLE_FUSED_OPS=1` turns all of them off (ablation). Providers are imported lazily so this module
loads on machines without them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from types import ModuleType

import torch

from skiff.kernels import cpu as cpu_kernels


@cache
def _flashinfer() -> ModuleType | None:
    if os.environ.get("SKIFF_DISABLE_FUSED_OPS") == "1":
        return None
    os.environ.setdefault("FLASHINFER_USE_CUDA_NORM", "1")  # the CUDA JIT norms, not the CuTe-DSL ones
    try:
        import flashinfer
    except ImportError:
        return None
    return flashinfer


@dataclass(frozen=True)
class GpuOps:
    name: str
    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    add_rms_norm_: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], None]
    rope_: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor], None]
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]


def _triton_ops() -> GpuOps | None:
    try:
        from skiff.kernels import triton_ops as t
    except ImportError:
        return None
    return GpuOps("triton", t.rms_norm, t.add_rms_norm_, t.rope_, t.silu_and_mul)


def _flashinfer_ops() -> GpuOps | None:
    fi = _flashinfer()
    if fi is None:
        return None

    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if x.dim() in (2, 3):
            return fi.rmsnorm(x, weight, eps, out=torch.empty(x.shape, dtype=x.dtype, device=x.device))
        return fi.rmsnorm(x.reshape(-1, x.shape[-1]), weight, eps).view(x.shape)

    def rope_(
        positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, head_dim: int, cos_sin: torch.Tensor
    ) -> None:
        fi.apply_rope_with_cos_sin_cache_inplace(positions, q, k, head_dim, cos_sin, is_neox=True)

    return GpuOps("flashinfer", rms_norm, fi.fused_add_rmsnorm, rope_, fi.silu_and_mul)


GPU_PROVIDERS: dict[str, Callable[[], GpuOps | None]] = {"triton": _triton_ops, "flashinfer": _flashinfer_ops}


@cache
def gpu_ops() -> GpuOps | None:
    if os.environ.get("SKIFF_DISABLE_FUSED_OPS") == "1":
        return None
    name = os.environ.get("SKIFF_FUSED_OPS", "triton")
    if name not in GPU_PROVIDERS:
        raise ValueError(f"SKIFF_FUSED_OPS={name!r}: choose one of {sorted(GPU_PROVIDERS)}")
    return GPU_PROVIDERS[name]()


def enabled(x: torch.Tensor) -> bool:
    if x.is_cuda:
        return gpu_ops() is not None
    return cpu_kernels.usable(x)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, D] or [T, H, D] (row/head strides allowed) -> normalized copy."""
    if not x.is_cuda:
        if x.dim() in (2, 3):
            return cpu_kernels.ops().rms_norm(x, weight, eps)
        return cpu_kernels.ops().rms_norm(x.reshape(-1, x.shape[-1]), weight, eps).view(x.shape)
    return _gpu().rms_norm(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: residual += x, x = norm(residual); returns (x, residual). Both must be contiguous 2-D."""
    if not x.is_cuda:
        cpu_kernels.ops().add_rms_norm_(x, residual, weight, eps)
    else:
        _gpu().add_rms_norm_(x, residual, weight, eps)
    return x, residual


def rope_inplace(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, head_dim: int, cos_sin: torch.Tensor
) -> None:
    """q: [T, Hq*D], k: [T, Hk*D] (row-strided views allowed), neox layout; cos_sin [max_pos, rotary_dim] fp32."""
    if not q.is_cuda:
        cpu_kernels.ops().rope_(q, k, positions, cos_sin, head_dim)
        return
    _gpu().rope_(positions, q, k, head_dim, cos_sin)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if not x.is_cuda:
        return cpu_kernels.ops().silu_and_mul(x)
    return _gpu().silu_and_mul(x)


def _gpu() -> GpuOps:
    ops = gpu_ops()
    assert ops is not None, "fused op called where enabled() is False"
    return ops

"""Fused ops: RMSNorm, fused add+RMSNorm, rotary embedding, SiLU-and-mul.

On CUDA they come from FlashInfer; on CPU (fp32) from Skiff's own kernels (skiff.kernels.cpu). The layers
call these only where `enabled(x)` holds and keep their torch versions otherwise (other dtypes, no
FlashInfer, no C++ compiler). `SKIFF_DISABLE_FUSED_OPS=1` turns both off (ablation). FlashInfer is imported
lazily so this module loads on machines without it.
"""

from __future__ import annotations

import os
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


def enabled(x: torch.Tensor) -> bool:
    if x.is_cuda:
        return _flashinfer() is not None
    return cpu_kernels.usable(x)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, D] or [T, H, D] (row/head strides allowed) -> normalized copy (fp32 statistics, one rounding)."""
    if not x.is_cuda:
        if x.dim() in (2, 3):
            return cpu_kernels.ops().rms_norm(x, weight, eps)
        return cpu_kernels.ops().rms_norm(x.reshape(-1, x.shape[-1]), weight, eps).view(x.shape)
    fi = _flashinfer()
    assert fi is not None
    if x.dim() in (2, 3):
        return fi.rmsnorm(x, weight, eps, out=torch.empty(x.shape, dtype=x.dtype, device=x.device))
    shape = x.shape
    return fi.rmsnorm(x.reshape(-1, shape[-1]), weight, eps).view(shape)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: residual += x, x = norm(residual); returns (x, residual). Both must be contiguous 2-D."""
    if not x.is_cuda:
        cpu_kernels.ops().add_rms_norm_(x, residual, weight, eps)
        return x, residual
    fi = _flashinfer()
    assert fi is not None
    fi.fused_add_rmsnorm(x, residual, weight, eps)
    return x, residual


def rope_inplace(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, head_dim: int,
                 cos_sin: torch.Tensor) -> None:
    """q: [T, Hq*D], k: [T, Hk*D] (row-strided views allowed), neox layout; cos_sin [max_pos, rotary_dim] fp32."""
    if not q.is_cuda:
        cpu_kernels.ops().rope_(q, k, positions, cos_sin, head_dim)
        return
    fi = _flashinfer()
    assert fi is not None
    fi.apply_rope_with_cos_sin_cache_inplace(positions, q, k, head_dim, cos_sin, is_neox=True)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if not x.is_cuda:
        return cpu_kernels.ops().silu_and_mul(x)
    fi = _flashinfer()
    assert fi is not None
    return fi.silu_and_mul(x)

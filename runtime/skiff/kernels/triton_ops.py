"""GPU fused ops in Triton that round where HF transformers rounds: RMSNorm, add+RMSNorm, rope, SiLU-and-mul.

Each op is one kernel, but its arithmetic follows the reference's torch code step by step in the model
dtype (bf16/fp16): RMSNorm rounds the normalized row before the weight multiply, the residual sum is
rounded before its statistics, rope rounds the cos/sin table and each product and sum, SiLU rounds before
the multiply. Kernels that compute in fp32 and round once are closer to exact, but on bf16 models their
different rounding moves argmaxes away from the reference; with matching rounding points Skiff's logits
track HF's. exp and division are the precise ones torch's CUDA kernels use (libdevice expf, div.rn).

layers/fused.py imports this lazily, for CUDA tensors (triton comes with CUDA builds of torch); CI runs the
kernels on CPU in Triton's interpreter (tests/runtime/test_triton_ops.py).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from skiff.kernels.triton_launcher import Launcher, cdiv, pow2

# torch's CUDA silu uses expf (libdevice); Triton's interpreter (TRITON_INTERPRET=1, the CPU check of these
# kernels) has no libdevice and takes tl.exp.
_LIBDEVICE = os.environ.get("TRITON_INTERPRET") != "1"


def _warps(block: int) -> int:
    return max(1, min(8, block // 256))


@triton.jit
def _rounded(x, dtype: tl.constexpr):
    """fp32 x rounded to dtype's mantissa (nearest even), kept in fp32. Done on the bits: written as
    .to(bf16).to(fp32), the compiler dropped the round trip inside rope's products and sums (and Triton's
    interpreter truncates there). fp16 subnormals (|x| < 6.1e-5) keep more bits than fp16 would."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    elif dtype == tl.float16:
        bits = x.to(tl.uint32, bitcast=True)
        return ((bits + 0xFFF + ((bits >> 13) & 1)) & 0xFFFFE000).to(tl.float32, bitcast=True)
    else:
        return x


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    x_tok,
    x_head,
    y_ptr,
    y_tok,
    y_head,
    w_ptr,
    rows,
    heads,
    d,
    inv_d,
    eps,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK)
    rmask, cmask = r < rows, c < d
    mask = rmask[:, None] & cmask[None, :]
    tok, head = r // heads, r % heads
    x = tl.load(x_ptr + tok[:, None] * x_tok + head[:, None] * x_head + c[None, :], mask=mask, other=0.0)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=1) * inv_d
    normed = _rounded(xf * tl.rsqrt(var + eps)[:, None], x.dtype)
    w = tl.load(w_ptr + c, mask=cmask, other=0.0).to(tl.float32)
    y = _rounded(normed * w[None, :], x.dtype).to(x.dtype)
    tl.store(y_ptr + tok[:, None] * y_tok + head[:, None] * y_head + c[None, :], y, mask=mask)


@triton.jit
def _add_rms_norm_kernel(x_ptr, x_tok, r_ptr, r_tok, w_ptr, d, inv_d, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    mask = c < d
    x = tl.load(x_ptr + row * x_tok + c, mask=mask, other=0.0)
    res = tl.load(r_ptr + row * r_tok + c, mask=mask, other=0.0)
    sf = _rounded(x.to(tl.float32) + res.to(tl.float32), x.dtype)
    tl.store(r_ptr + row * r_tok + c, sf.to(x.dtype), mask=mask)
    var = tl.sum(sf * sf, axis=0) * inv_d
    normed = _rounded(sf * tl.rsqrt(var + eps), x.dtype)
    w = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
    tl.store(x_ptr + row * x_tok + c, _rounded(normed * w, x.dtype).to(x.dtype), mask=mask)


@triton.jit
def _rotate_heads(
    ptr, row_stride, tok, heads, head_dim, half, cos, sin, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr
):
    h = tl.arange(0, BLOCK_H)
    j = tl.arange(0, BLOCK_HALF)
    mask = (h < heads)[:, None] & (j < half)[None, :]
    p1 = ptr + tok * row_stride + h[:, None] * head_dim + j[None, :]
    x1 = tl.load(p1, mask=mask, other=0.0)
    x2 = tl.load(p1 + half, mask=mask, other=0.0)
    dt: tl.constexpr = x1.dtype
    c, s = _rounded(cos, dt)[None, :], _rounded(sin, dt)[None, :]
    a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
    o1 = _rounded(_rounded(a1 * c, dt) - _rounded(a2 * s, dt), dt)
    o2 = _rounded(_rounded(a2 * c, dt) + _rounded(a1 * s, dt), dt)
    tl.store(p1, o1.to(dt), mask=mask)
    tl.store(p1 + half, o2.to(dt), mask=mask)


@triton.jit
def _rope_kernel(
    pos_ptr,
    q_ptr,
    q_stride,
    k_ptr,
    k_stride,
    cs_ptr,
    cs_stride,
    q_heads,
    k_heads,
    head_dim,
    half,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    tok = tl.program_id(0)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cs_ptr + pos * cs_stride + j, mask=j < half, other=0.0)
    sin = tl.load(cs_ptr + pos * cs_stride + half + j, mask=j < half, other=0.0)
    _rotate_heads(q_ptr, q_stride, tok, q_heads, head_dim, half, cos, sin, BLOCK_HQ, BLOCK_HALF)
    _rotate_heads(k_ptr, k_stride, tok, k_heads, head_dim, half, cos, sin, BLOCK_HK, BLOCK_HALF)


@triton.jit
def _silu_and_mul_kernel(x_ptr, x_tok, y_ptr, y_tok, inner, BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = c < inner
    gate = tl.load(x_ptr + row * x_tok + c, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * x_tok + inner + c, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    e = libdevice.exp(-g) if LIBDEVICE else tl.exp(-g)
    act = _rounded(tl.math.div_rn(g, 1.0 + e), gate.dtype)
    tl.store(y_ptr + row * y_tok + c, _rounded(act * up.to(tl.float32), gate.dtype).to(gate.dtype), mask=mask)


_RMS_NORM, _ADD_RMS_NORM = Launcher(_rms_norm_kernel), Launcher(_add_rms_norm_kernel)
_ROPE, _SILU_AND_MUL = Launcher(_rope_kernel), Launcher(_silu_and_mul_kernel)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, D] or [T, H, D] with unit stride in D (row and head strides free) -> a contiguous normalized copy."""
    d = x.shape[-1]
    if x.dim() == 2:
        x3, heads, x_tok, x_head = x, 1, x.stride(0), 0
    else:
        x3 = x if x.dim() == 3 else x.reshape(-1, x.shape[-2], d)
        heads, x_tok, x_head = x3.shape[1], x3.stride(0), x3.stride(1)
    assert x3.stride(-1) == 1
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    rows = x.numel() // d
    block = pow2(d)
    per_prog = max(1, min(16, 2048 // block))
    if rows:
        _RMS_NORM(
            (cdiv(rows, per_prog),),
            (x3, x_tok, x_head, y, heads * d, d, weight, rows, heads, d, 1.0 / d, eps),
            {"ROWS": per_prog, "BLOCK": block},
            _warps(block * per_prog),
        )
    return y


def add_rms_norm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: residual = x + residual (rounded), x = norm(residual). Both [T, D] with unit stride in D."""
    t, d = x.shape
    assert x.stride(1) == 1 and residual.stride(1) == 1
    block = pow2(d)
    if t:
        _ADD_RMS_NORM(
            (t,),
            (x, x.stride(0), residual, residual.stride(0), weight, d, 1.0 / d, eps),
            {"BLOCK": block},
            _warps(block),
        )


def rope_(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, head_dim: int, cos_sin: torch.Tensor
) -> None:
    """Neox rope in place. q: [T, Hq*D], k: [T, Hk*D] (row strides free); cos_sin: [max_pos, rotary_dim] fp32."""
    t = q.shape[0]
    half = cos_sin.shape[1] // 2
    assert q.stride(1) == 1 and k.stride(1) == 1 and cos_sin.stride(1) == 1
    hq, hk = q.shape[1] // head_dim, k.shape[1] // head_dim
    if t:
        _ROPE(
            (t,),
            (positions, q, q.stride(0), k, k.stride(0), cos_sin, cos_sin.stride(0), hq, hk, head_dim, half),
            {"BLOCK_HQ": pow2(hq), "BLOCK_HK": pow2(hk), "BLOCK_HALF": pow2(half)},
            4,
        )


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2I] (gate | up), unit stride in the last dim -> silu(gate) * up, [T, I]."""
    t, inner = x.shape[0], x.shape[1] // 2
    assert x.stride(1) == 1
    y = torch.empty((t, inner), dtype=x.dtype, device=x.device)
    block = min(1024, pow2(inner))
    if t:
        _SILU_AND_MUL(
            (t, cdiv(inner, block)),
            (x, x.stride(0), y, inner, inner),
            {"BLOCK": block, "LIBDEVICE": _LIBDEVICE},
            _warps(block),
        )
    return y

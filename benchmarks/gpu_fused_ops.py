"""The GPU fused-op providers against HF's torch code: bit-equality and time (a section of gpu_h200.py).

For each op (RMSNorm on rows and on q heads, add+RMSNorm, rope, SiLU-and-mul) in bf16, on fresh random
inputs: the fraction of output elements bit-equal to HF transformers' own torch code (LlamaRMSNorm,
residual add, apply_rotary_pos_emb with HF's bf16 cos/sin, silu(gate) * up), and the median time
(triton.testing.do_bench) at a decode shape (256 tokens) and a prefill shape (16,384 tokens), Qwen3-0.6B
widths, for Skiff's Triton kernels and FlashInfer's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

HIDDEN, INTER, HQ, HK, HD = 1024, 3072, 16, 8, 128  # Qwen3-0.6B widths


def _random(gen: torch.Generator, dtype: torch.dtype) -> Any:
    """rnd(*shape, scale=1.0): fresh normal values from gen, in dtype, on gen's device."""

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device=gen.device, generator=gen) * scale).to(dtype)

    return rnd


def _hf_ops(dtype: torch.dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

    def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        norm = LlamaRMSNorm(x.shape[-1], eps).to(x.device)
        norm.weight.data = w
        return norm(x)

    def rope(pos: torch.Tensor, q: torch.Tensor, k: torch.Tensor, hd: int, inv_freq: torch.Tensor):
        freqs = pos[:, None].float() * inv_freq[None]
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos().to(dtype)[None], emb.sin().to(dtype)[None]
        t = q.shape[0]
        qr, kr = apply_rotary_pos_emb(
            q.reshape(1, t, -1, hd).transpose(1, 2), k.reshape(1, t, -1, hd).transpose(1, 2), cos, sin
        )
        return qr.transpose(1, 2).reshape(t, -1), kr.transpose(1, 2).reshape(t, -1)

    return rms, rope


def fused_ops_section(device: str = "cuda", dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    from skiff.layers import fused

    out: dict[str, Any] = {}
    gen = torch.Generator(device=device).manual_seed(3)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, HD, 2, device=device).float() / HD))
    table = torch.outer(torch.arange(8192, device=device).float(), inv_freq)
    cos_sin = torch.cat([table.cos(), table.sin()], -1)
    for name in fused.GPU_PROVIDERS:
        ops = fused.GPU_PROVIDERS[name]()
        if ops is None:
            out[name] = "unavailable"
            continue
        res = {
            str(dt).removeprefix("torch."): _equality(ops, dt, gen, inv_freq, cos_sin)
            for dt in (dtype, torch.float16)
        }
        for label, t in (("decode_256", 256), ("prefill_16384", 16384)):
            res[f"us_{label}"] = _time_ops(ops, t, _random(gen, dtype), cos_sin, gen)
        out[name] = res
    return out


def _equality(
    ops: Any, dtype: torch.dtype, gen: torch.Generator, inv_freq: torch.Tensor, cos_sin: torch.Tensor
) -> dict[str, Any]:
    """Fraction of output elements bit-equal to HF's torch code, on fresh random inputs."""
    hf_rms, hf_rope = _hf_ops(dtype)
    rnd = _random(gen, dtype)
    hidden, inter, hq, hk, hd = HIDDEN, INTER, HQ, HK, HD
    res: dict[str, Any] = {}
    t = 1000
    w = rnd(hidden, scale=0.2) + 1
    x = rnd(t, hidden, scale=3)
    res["rms_norm_equal"] = float((ops.rms_norm(x, w, 1e-6) == hf_rms(x, w, 1e-6)).float().mean())
    qkv = rnd(t, (hq + 2 * hk) * hd)
    wh = rnd(hd, scale=0.2) + 1
    q3 = qkv[:, : hq * hd].view(t, hq, hd)
    res["head_norm_equal"] = float((ops.rms_norm(q3, wh, 1e-6) == hf_rms(q3, wh, 1e-6)).float().mean())
    r = rnd(t, hidden, scale=5)
    s_ref = r + x
    y_ref = hf_rms(s_ref, w, 1e-6)
    x2, r2 = x.clone(), r.clone()
    ops.add_rms_norm_(x2, r2, w, 1e-6)
    res["add_rms_norm_equal"] = [float((r2 == s_ref).float().mean()), float((x2 == y_ref).float().mean())]
    pos = torch.randint(0, cos_sin.shape[0], (t,), device=gen.device, generator=gen)
    q, k = qkv[:, : hq * hd], qkv[:, hq * hd : (hq + hk) * hd]
    qr, kr = hf_rope(pos, q, k, hd, inv_freq)
    ops.rope_(pos, q, k, hd, cos_sin)
    res["rope_equal"] = [float((q == qr).float().mean()), float((k == kr).float().mean())]
    gu = rnd(t, 2 * inter, scale=3)
    gate, up = gu.chunk(2, -1)
    res["silu_and_mul_equal"] = float((ops.silu_and_mul(gu) == F.silu(gate) * up).float().mean())
    return res


def _time_ops(ops: Any, t: int, rnd: Any, cos_sin: torch.Tensor, gen: torch.Generator) -> dict[str, float]:
    """Median microseconds per call at t tokens (Qwen3-0.6B widths)."""
    import triton.testing

    hidden, inter, hq, hk, hd = HIDDEN, INTER, HQ, HK, HD
    x, r, w, wh = rnd(t, hidden), rnd(t, hidden), rnd(hidden) + 1, rnd(hd) + 1
    qkv = rnd(t, (hq + 2 * hk) * hd)
    q, k = qkv[:, : hq * hd], qkv[:, hq * hd : (hq + hk) * hd]
    pos = torch.randint(0, cos_sin.shape[0], (t,), device=x.device, generator=gen)
    gu = rnd(t, 2 * inter)
    calls = {
        "rms_norm": lambda: ops.rms_norm(x, w, 1e-6),
        "head_norm": lambda: ops.rms_norm(q.view(t, hq, hd), wh, 1e-6),
        "add_rms_norm": lambda: ops.add_rms_norm_(x, r, w, 1e-6),
        "rope": lambda: ops.rope_(pos, q, k, hd, cos_sin),
        "silu_and_mul": lambda: ops.silu_and_mul(gu),
    }
    return {
        op: round(1e3 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"), 2)
        for op, fn in calls.items()
    }

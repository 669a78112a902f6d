"""Run by test_triton_ops.py under TRITON_INTERPRET=1: Skiff's Triton kernels on CPU vs HF's torch code.

Prints one JSON object: for each dtype and case, the fraction of output elements bit-equal to the reference
and the largest difference relative to the reference's largest element.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F

assert os.environ.get("TRITON_INTERPRET") == "1"

from skiff.kernels import triton_ops as T  # noqa: E402
from skiff.layers.rotary import RopeConfig, RotaryEmbedding  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb  # noqa: E402


def frac(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    """[fraction of elements bit-equal, max |a - b| / max |b|]"""
    assert a.shape == b.shape, (a.shape, b.shape)
    return [
        float((a == b).float().mean()),
        float((a.float() - b.float()).abs().max() / b.float().abs().max()),
    ]


def hf_rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    norm = LlamaRMSNorm(x.shape[-1], eps)
    norm.weight.data = w
    return norm(x)


def cases(dtype: torch.dtype, gen: torch.Generator) -> dict[str, list[float]]:
    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    out: dict[str, list[float]] = {}
    t, d = 19, 576  # a width that is not a power of two
    wide = rnd(t, d + 40, scale=3)
    x, w = wide[:, :d], rnd(d, scale=0.2) + 1  # strided rows
    out["rms_norm_rows"] = frac(T.rms_norm(x, w, 1e-5), hf_rms(x, w, 1e-5))
    hq, hk, hd = 6, 2, 64
    qkv = rnd(t, (hq + 2 * hk) * hd)
    wh = rnd(hd, scale=0.2) + 1
    heads = qkv[:, hq * hd : (hq + hk) * hd].view(t, hk, hd)  # k heads: row and head strides
    out["rms_norm_heads"] = frac(T.rms_norm(heads, wh, 1e-6), hf_rms(heads, wh, 1e-6))
    h, r = rnd(t, d, scale=2), rnd(t, d, scale=5)
    s_ref = r + h
    y_ref = hf_rms(s_ref, w, 1e-5)
    T.add_rms_norm_(h, r, w, 1e-5)
    out["add_rms_norm_residual"], out["add_rms_norm_out"] = frac(r, s_ref), frac(h, y_ref)
    pos = torch.randint(0, 3000, (t,), generator=gen)
    for rot in (hd, hd // 2):
        rotary = RotaryEmbedding(RopeConfig(rot, 10000.0, 4096), hd)
        q, k = qkv[:, : hq * hd].clone(), qkv[:, hq * hd : (hq + hk) * hd].clone()
        if rot == hd:  # HF's own code, with its bf16-rounded cos/sin
            freqs = pos[:, None].float() * (1.0 / 10000.0 ** (torch.arange(0, hd, 2).float() / hd))[None]
            emb = torch.cat([freqs, freqs], -1)
            qr, kr = apply_rotary_pos_emb(
                q.view(1, t, hq, hd).transpose(1, 2),
                k.view(1, t, hk, hd).transpose(1, 2),
                emb.cos().to(dtype)[None],
                emb.sin().to(dtype)[None],
            )
            qr, kr = qr.transpose(1, 2), kr.transpose(1, 2)
        else:  # partial rotary: Skiff's torch path, which rounds the same way
            qr, kr = rotary(pos, q.view(t, hq, hd), k.view(t, hk, hd))
        T.rope_(pos, q, k, hd, rotary.cos_sin)
        out[f"rope_{rot}_q"] = frac(q.view(t, hq, hd), qr.reshape(t, hq, hd))
        out[f"rope_{rot}_k"] = frac(k.view(t, hk, hd), kr.reshape(t, hk, hd))
    gu = rnd(t, 2 * 320, scale=3)
    gate, up = gu.chunk(2, -1)
    out["silu_and_mul"] = frac(T.silu_and_mul(gu), F.silu(gate) * up)
    return out


if __name__ == "__main__":
    gen = torch.Generator().manual_seed(0)
    print(
        json.dumps(
            {
                str(dt).removeprefix("torch."): cases(dt, gen)
                for dt in (torch.bfloat16, torch.float16, torch.float32)
            }
        )
    )

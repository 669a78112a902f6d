"""Rotary position embeddings (neox / HF `rotate_half` layout) with default, linear, llama3 and yarn scaling."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from skiff.layers import fused


@dataclass(frozen=True)
class RopeConfig:
    rotary_dim: int
    theta: float
    max_position: int
    scaling: dict[str, Any] = field(default_factory=dict)  # HF rope_parameters / rope_scaling, minus theta


def _default_inv_freq(dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def _llama3(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_ctx = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    return torch.where(medium, smoothed, scaled)


def _yarn(dim: int, theta: float, s: dict[str, Any], max_position: int) -> tuple[torch.Tensor, float]:
    orig = s.get("original_max_position_embeddings") or max_position
    factor = s.get("factor") or max_position / orig

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn_factor = s.get("attention_factor")
    if attn_factor is None:
        if s.get("mscale") and s.get("mscale_all_dim"):
            attn_factor = mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
        else:
            attn_factor = mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    lo, hi = correction_dim(s.get("beta_fast", 32.0)), correction_dim(s.get("beta_slow", 1.0))
    if s.get("truncate", True):
        lo, hi = max(math.floor(lo), 0), min(math.ceil(hi), dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
    extrapolation = _default_inv_freq(dim, theta)
    extrapolation_weight = 1 - ramp
    inv_freq = (extrapolation / factor) * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    return inv_freq, float(attn_factor)


def rope_inv_freq(cfg: RopeConfig) -> tuple[torch.Tensor, float]:
    kind = cfg.scaling.get("rope_type") or cfg.scaling.get("type") or "default"
    inv_freq = _default_inv_freq(cfg.rotary_dim, cfg.theta)
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / cfg.scaling["factor"], 1.0
    if kind == "llama3":
        return _llama3(inv_freq, cfg.scaling), 1.0
    if kind == "yarn":
        return _yarn(cfg.rotary_dim, cfg.theta, cfg.scaling, cfg.max_position)
    raise ValueError(f"unsupported rope scaling type {kind!r} (supported: default, linear, llama3, yarn)")


class RotaryEmbedding(nn.Module):
    def __init__(self, cfg: RopeConfig, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = cfg.rotary_dim
        inv_freq, scale = rope_inv_freq(cfg)
        t = torch.arange(cfg.max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        cache = torch.cat([freqs.cos() * scale, freqs.sin() * scale], dim=-1).float()
        self.register_buffer(
            "cos_sin", cache, persistent=False
        )  # [max_position, rotary_dim], fp32 as HF computes it

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, Hq, D], k: [T, Hk, D]; rotates the first rotary_dim channels in place of a copy."""
        cos, sin = self.cos_sin.index_select(0, positions).chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def forward_inplace(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
        """GPU: q [T, Hq*D], k [T, Hk*D] rotated in place by the fused kernel."""
        fused.rope_inplace(positions, q, k, self.head_dim, self.cos_sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # HF's order of rounding: the table is rounded to x's dtype and each product and sum rounds in that
        # dtype; computing in fp32 and rounding once is closer to exact but makes bf16 argmaxes differ from HF.
        rot = x[..., : self.rotary_dim]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        x1, x2 = rot.chunk(2, dim=-1)
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        if self.rotary_dim == self.head_dim:
            return out
        return torch.cat([out, x[..., self.rotary_dim :]], dim=-1)

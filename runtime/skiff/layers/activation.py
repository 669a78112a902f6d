from __future__ import annotations

import torch
import torch.nn.functional as F

from skiff.layers import fused


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if fused.enabled(x):
        return fused.silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up

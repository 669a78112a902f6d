from __future__ import annotations

import torch
from torch import nn

from skiff.layers import fused


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused.enabled(x):
            return fused.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused residual add + norm: returns (norm(x + residual), x + residual). On GPU both are updated in place."""
        if fused.enabled(x) and x.dim() == 2 and x.is_contiguous() and residual.is_contiguous():
            return fused.add_rms_norm(x, residual, self.weight, self.eps)
        residual = x + residual
        return self.forward(residual), residual

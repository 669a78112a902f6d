"""Linear layers on a GGUF file's own quantized blocks (CPU, `--quantization auto` or `gguf`).

The loader keeps a GGUF tensor whose type has a kernel as a `GGUFWeight` (its raw blocks, row-major); the
layers slice, permute and concatenate those rows without touching the numbers, and `GGUFLinear` packs them
once for Skiff's kernel (kernels/cpu_gguf.cpp), which takes integer dot products of the weights' codes
with int8 activations quantized per 32 values. Types without a kernel are dequantized to float
(gguf.quants.dequantize), which is also the reference the kernels are tested against.

Activations are `precise` by default: two int8 terms per value (the second quantizes what the first
leaves at 1/254 of its step). With one int8 term (llama.cpp's choice) the embedded model's greedy tokens
left the fp32 reference's (same blocks, dequantized) at ~5 % of teacher-forced positions, and keeping
two terms only in some layers (the LM head, q/k/v and gate/up; or only for decode rows) still left
2.5-6.5 %: the rounding noise is larger than many top-2 logit gaps. With two terms everywhere none of
1,024 positions diverged (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from skiff.kernels import cpu as cpu_kernels

# GGML types Skiff computes on directly (kernels/cpu_gguf.cpp), by their names in `--quantization` messages
KERNEL_TYPES: frozenset[GGMLQuantizationType] = frozenset(
    {
        GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.Q4_1,
        GGMLQuantizationType.Q8_0,
        GGMLQuantizationType.Q4_K,
        GGMLQuantizationType.Q6_K,
    }
)


@dataclass(frozen=True)
class GGUFWeight:
    """A 2-D GGUF tensor as stored: `raw` is [rows, row_bytes] uint8, each row `cols` values of `qtype`."""

    raw: np.ndarray
    qtype: GGMLQuantizationType
    cols: int

    def __post_init__(self) -> None:
        block_values, block_bytes = GGML_QUANT_SIZES[self.qtype]
        if (
            self.raw.ndim != 2
            or self.cols % block_values
            or self.raw.shape[1] != self.cols // block_values * block_bytes
        ):
            raise ValueError(
                f"GGUF {self.qtype.name} tensor of {tuple(self.raw.shape)} bytes does not hold rows of "
                f"{self.cols} values"
            )

    @property
    def shape(self) -> tuple[int, int]:
        return (self.raw.shape[0], self.cols)

    @property
    def block_values(self) -> int:
        return GGML_QUANT_SIZES[self.qtype][0]

    def take_rows(self, start: int, stop: int) -> GGUFWeight:
        return GGUFWeight(self.raw[start:stop], self.qtype, self.cols)

    def take_cols(self, start: int, stop: int) -> GGUFWeight:
        """Columns [start, stop): whole blocks only."""
        bv, bb = GGML_QUANT_SIZES[self.qtype]
        if start % bv or stop % bv:
            raise ValueError(f"columns [{start}, {stop}) split {self.qtype.name} blocks of {bv} values")
        return GGUFWeight(self.raw[:, start // bv * bb : stop // bv * bb], self.qtype, stop - start)

    def permute_rows(self, heads: int) -> GGUFWeight:
        """Undo llama.cpp's interleaving of rotary halves in q/k rows: moves whole rows of blocks."""
        rows, width = self.raw.shape
        raw = self.raw.reshape(heads, rows // heads // 2, 2, width).transpose(0, 2, 1, 3).reshape(rows, width)
        return GGUFWeight(raw, self.qtype, self.cols)

    def dequantize(self) -> torch.Tensor:
        from gguf.quants import dequantize

        arr = dequantize(np.ascontiguousarray(self.raw), self.qtype)
        return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32).reshape(self.shape))


def concat_rows(parts: Sequence[GGUFWeight]) -> GGUFWeight:
    first = parts[0]
    if any(p.qtype != first.qtype or p.cols != first.cols for p in parts):
        raise ValueError("only GGUF tensors of one type and width concatenate")
    return GGUFWeight(np.concatenate([p.raw for p in parts]), first.qtype, first.cols)


class GGUFLinear:
    """y = x W^T (+ b) on W's GGUF blocks, packed for Skiff's kernel."""

    def __init__(self, weight: GGUFWeight, bias: torch.Tensor | None = None, precise: bool = True) -> None:
        self.precise = precise
        if weight.qtype not in KERNEL_TYPES:
            raise ValueError(f"no GGUF kernel for {weight.qtype.name}")
        if not cpu_kernels.available():
            raise ValueError("the GGUF kernels need Skiff's CPU kernels, which could not be built here")
        self.qtype = int(weight.qtype)
        self.out_features, self.in_features = weight.shape
        raw = torch.from_numpy(np.require(weight.raw, requirements=["C", "W"]))  # a memmap is read-only
        self.codes, self.scales, self.offsets = cpu_kernels.ops().gguf_pack(raw, self.qtype, self.in_features)
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self._op = cpu_kernels.ops().gguf_linear

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x
        if x.dim() != 2 or x.stride(1) != 1:  # the model's 2-D rows skip the reshape op (~9 us each here)
            rows = x.reshape(-1, x.shape[-1])
            if rows.stride(-1) != 1:
                rows = rows.contiguous()
        args = (self.codes, self.scales, self.offsets, self.qtype, self.out_features, self.bias, self.precise)
        y = self._op(rows, *args)
        return y if rows is x else y.view(*x.shape[:-1], self.out_features)


class ConcatLinear:
    """Fused parts of different GGUF types (e.g. a Q6_K v beside Q4_K q, k): one kernel each, outputs joined."""

    def __init__(self, parts: Sequence[GGUFLinear], bias: torch.Tensor | None) -> None:
        self.parts = list(parts)
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([part(x) for part in self.parts], dim=-1)
        return y if self.bias is None else y + self.bias


def gguf_kernel(
    parts: Sequence[GGUFWeight], bias: torch.Tensor | None, precise: bool = True
) -> GGUFLinear | ConcatLinear:
    """One kernel over fused parts (rows concatenated) where they share a type, else one per part."""
    if len({p.qtype for p in parts}) == 1:
        return GGUFLinear(concat_rows(parts) if len(parts) > 1 else parts[0], bias, precise)
    return ConcatLinear([GGUFLinear(p, None, precise) for p in parts], bias)

"""Opt-in int8 linear layers for CPU (`--quantization int8`): int8 weights, int8 activations, integer dot products.

Weights are quantized once after loading, symmetric per output channel; activations are quantized on each
call, per token (each row by its own absolute maximum, so one token's outlier does not coarsen the batch).
The activation range is 7-bit because AVX2 without VNNI accumulates u8 x s8 pairs in saturating int16, which
a full 8-bit range overflows. Skiff's own kernel (kernels/cpu_int8.cpp) streams weights packed for it and
beats fbgemm's dynamic linear at every batch size on this class of CPU, most at decode's small batches;
fbgemm remains the path where the kernels cannot be built. This is the trade llama.cpp makes on CPU: a
measured loss of quality (docs/performance.md) for ~4x less weight traffic per decode step and well over
twice the matmul rate of fp32. GPU paths never take it.
"""

from __future__ import annotations

import warnings

import torch

from skiff.kernels import cpu as cpu_kernels
from skiff.layers.linear import KernelFactory


class Int8Linear:
    """y = x W^T (+ b) with W quantized per output channel: Skiff's kernel, or fbgemm's dynamic linear."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        w = weight.detach().float()
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.own_kernel = cpu_kernels.usable(w)
        if self.own_kernel:
            self.packed, self.scale, self.colsum = cpu_kernels.ops().int8_pack_weight(w)
            return
        scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        with (
            warnings.catch_warnings()
        ):  # torch 2.13 flags quantized tensors as deprecated; fbgemm still takes them
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(qweight, None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.own_kernel:
            rows = x.reshape(-1, x.shape[-1])
            if rows.stride(-1) != 1:
                rows = rows.contiguous()
            y = cpu_kernels.ops().int8_linear(rows, self.packed, self.scale, self.colsum, self.bias)
            return y.view(*x.shape[:-1], y.shape[-1])
        if x.dim() == 2 and cpu_kernels.usable(x):
            x, amax = cpu_kernels.ops().row_normalize(x)
        else:
            amax = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)
            x = (x / amax).contiguous()
        y = torch.ops.quantized.linear_dynamic(x, self.packed, True).mul_(amax)
        return y if self.bias is None else y + self.bias


QUANTIZATIONS: dict[str, KernelFactory] = {"int8": Int8Linear}  # kernels built from loaded float weights


def resolve_quantization(
    requested: str | None, gguf_file: bool, device: torch.device, dtype: torch.dtype
) -> str | None:
    """The path a model runs on: "gguf" (its own blocks), "int8", or None (float weights).

    "auto" takes a GGUF file's blocks where they can run (CPU, fp32 activations, the kernels built), and
    float weights everywhere else; an explicit choice that cannot run is an error.
    """
    if requested in (None, "none"):
        return None
    if requested == "auto":
        native = gguf_file and device.type == "cpu" and dtype == torch.float32 and cpu_kernels.available()
        return "gguf" if native else None
    if requested == "gguf":
        if not gguf_file:
            raise ValueError(
                "--quantization gguf computes on a GGUF file's blocks: the model is not a .gguf file"
            )
        if device.type != "cpu" or dtype != torch.float32:
            raise ValueError("--quantization gguf is a CPU path with float32 activations: use --device cpu")
        if not cpu_kernels.available():
            raise ValueError("--quantization gguf needs Skiff's CPU kernels, which could not be built here")
        return "gguf"
    check_supported(requested, device, dtype)
    return requested


def check_supported(quantization: str | None, device: torch.device, dtype: torch.dtype) -> None:
    if quantization is None:
        return
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r} (supported: {', '.join(QUANTIZATIONS)})")
    if device.type != "cpu":
        raise ValueError("--quantization int8 is a CPU path (fbgemm); on GPU serve bf16")
    if dtype != torch.float32:
        raise ValueError(
            "--quantization int8 computes around fp32 activations: use --dtype float32 (or auto)"
        )
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        raise ValueError("--quantization int8 needs a torch build with fbgemm (x86)")

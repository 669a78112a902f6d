"""Tensor-parallel linear layers and embeddings.

Each parameter carries a `weight_loader(param, tensor, shard)` that copies this rank's slice of a full
checkpoint tensor into it, so the loader can stream tensors one by one without ever holding the model twice.

A layer can swap its matmul for a `LinearKernel` built from its loaded weight (`quantize`, e.g. the int8
kernels of skiff.layers.quant); the forward then calls that kernel instead of F.linear. A layer can also
take a GGUF tensor's blocks as they are (`load_gguf`); `attach_gguf_kernels` then builds its kernel from
them (skiff.layers.gguf_quant), or dequantizes them into the weight where no kernel fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from skiff.distributed.parallel import all_gather_last_dim, all_reduce, tp_info
from skiff.layers.gguf_quant import GGUFWeight, gguf_kernel


class LinearKernel(Protocol):
    """y = x W^T (+ b) for the weight (and bias) it was built from."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


KernelFactory = Callable[[torch.Tensor, torch.Tensor | None], LinearKernel]


def _copy_checked(param: torch.Tensor, value: torch.Tensor, what: str) -> None:
    if tuple(param.shape) != tuple(value.shape):
        raise ValueError(
            f"shape mismatch for {what}: checkpoint slice {tuple(value.shape)}, model expects {tuple(param.shape)}"
        )
    param.data.copy_(value)


def default_loader(param: nn.Parameter, tensor: torch.Tensor, shard: object = None) -> None:
    _copy_checked(param, tensor, getattr(param, "skiff_name", "parameter"))


class ColumnParallelLinear(nn.Module):
    """y = x W^T with W's output rows split over ranks. `parts` are the fused pieces (e.g. q, k, v).

    part_heads/head_dim describe per-part head layout so that KV heads can be replicated when tp exceeds
    their count: each rank then holds head `rank * heads // tp` of that part.
    """

    def __init__(
        self,
        in_features: int,
        part_sizes: Sequence[int],
        bias: bool,
        head_dim: int | None = None,
        replicate_parts: Sequence[bool] | None = None,
    ) -> None:
        super().__init__()
        tp = tp_info()
        self.in_features = in_features
        self.full_sizes = list(part_sizes)
        self.replicate = list(replicate_parts or [False] * len(part_sizes))
        self.head_dim = head_dim
        self.local_sizes = [
            (head_dim if rep else size // tp.size)
            for size, rep in zip(part_sizes, self.replicate, strict=True)
        ]
        out = sum(self.local_sizes)
        self.weight = nn.Parameter(torch.empty(out, in_features), requires_grad=False)
        self.weight.weight_loader = self._load  # type: ignore[attr-defined]
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(out), requires_grad=False)
            self.bias.weight_loader = self._load  # type: ignore[attr-defined]
        self.kernel: LinearKernel | None = None
        self.gguf_parts: dict[int, GGUFWeight] = {}

    def _rows(self, rows: int, part: int) -> tuple[int, int]:
        """This rank's rows [start, stop) of part `part`, whose checkpoint tensor has `rows` rows."""
        tp = tp_info()
        full = self.full_sizes[part]
        if rows != full:
            raise ValueError(f"shape mismatch: checkpoint part {part} has {rows} rows, model expects {full}")
        if self.replicate[part]:
            assert self.head_dim is not None
            head = tp.rank * (full // self.head_dim) // tp.size
            return head * self.head_dim, (head + 1) * self.head_dim
        per = full // tp.size
        return tp.rank * per, (tp.rank + 1) * per

    def _slice(self, tensor: torch.Tensor, part: int) -> torch.Tensor:
        start, stop = self._rows(tensor.shape[0], part)
        return tensor[start:stop]

    def load_gguf(self, weight: GGUFWeight, part: int | None = None) -> None:
        part = 0 if part is None else part
        if weight.cols != self.in_features:
            raise ValueError(
                f"shape mismatch: checkpoint {weight.shape}, model expects {self.in_features} columns"
            )
        self.gguf_parts[part] = weight.take_rows(*self._rows(weight.shape[0], part))

    def attach_gguf(self) -> bool:
        parts = [self.gguf_parts.get(i) for i in range(len(self.full_sizes))]
        self.gguf_parts = {}
        if all(p is not None for p in parts):
            self.kernel = gguf_kernel(parts, self.bias)  # type: ignore[arg-type]
            self.weight.data = torch.empty(0)
            return True
        for i, p in enumerate(parts):  # beside float parts: widen to the weight's dtype
            if p is not None:
                offset = sum(self.local_sizes[:i])
                self.weight.data[offset : offset + self.local_sizes[i]].copy_(p.dequantize())
        return False

    def _load(self, param: nn.Parameter, tensor: torch.Tensor, part: int | None = None) -> None:
        part = 0 if part is None else part
        offset = sum(self.local_sizes[:part])
        size = self.local_sizes[part]
        _copy_checked(
            param.data[offset : offset + size],
            self._slice(tensor, part),
            getattr(param, "skiff_name", "linear"),
        )

    def quantize(self, make: KernelFactory) -> None:
        self.kernel = make(self.weight, self.bias)
        self.weight.data = torch.empty(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None:
            return self.kernel(x)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = x W^T with W's input columns split over ranks; partial sums are all-reduced."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        tp = tp_info()
        if in_features % tp.size:
            raise ValueError(f"cannot split {in_features} input features over tensor-parallel size {tp.size}")
        self.tp = tp
        self.local_in = in_features // tp.size
        self.weight = nn.Parameter(torch.empty(out_features, self.local_in), requires_grad=False)
        self.weight.weight_loader = self._load  # type: ignore[attr-defined]
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
        self.kernel: LinearKernel | None = None
        self.gguf: GGUFWeight | None = None

    def quantize(self, make: KernelFactory) -> None:
        self.kernel = make(self.weight, None)  # the bias is added after the all-reduce
        self.weight.data = torch.empty(0)

    def load_gguf(self, weight: GGUFWeight, part: object = None) -> None:
        if weight.shape != (self.weight.shape[0], self.local_in * self.tp.size):
            raise ValueError(
                f"shape mismatch: checkpoint {weight.shape}, model expects {tuple(self.weight.shape)}"
            )
        self.gguf = weight

    def attach_gguf(self) -> bool:
        weight, self.gguf = self.gguf, None
        if weight is None:
            return False
        start = self.tp.rank * self.local_in
        if start % weight.block_values or self.local_in % weight.block_values:  # a rank would split blocks
            self.weight.data.copy_(weight.dequantize()[:, start : start + self.local_in])
            return False
        self.kernel = gguf_kernel([weight.take_cols(start, start + self.local_in)], None)
        self.weight.data = torch.empty(0)
        return True

    def _load(self, param: nn.Parameter, tensor: torch.Tensor, part: object = None) -> None:
        rank = tp_info().rank
        if tensor.dim() != 2 or tensor.shape[1] != self.local_in * tp_info().size:
            raise ValueError(
                f"shape mismatch for {getattr(param, 'skiff_name', 'linear')}: checkpoint {tuple(tensor.shape)}"
            )
        _copy_checked(
            param,
            tensor[:, rank * self.local_in : (rank + 1) * self.local_in],
            getattr(param, "skiff_name", "linear"),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = all_reduce(self.kernel(x) if self.kernel is not None else F.linear(x, self.weight), self.tp)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding rows split over ranks (vocab padded to a multiple of tp); also serves as the LM head."""

    def __init__(self, vocab_size: int, dim: int) -> None:
        super().__init__()
        tp = tp_info()
        self.tp = tp
        self.vocab_size = vocab_size
        self.per_rank = -(-vocab_size // tp.size)
        self.start = tp.rank * self.per_rank
        self.weight = nn.Parameter(torch.zeros(self.per_rank, dim), requires_grad=False)
        self.weight.weight_loader = self._load  # type: ignore[attr-defined]
        self.head_kernel: LinearKernel | None = None  # for logits only: lookups keep the rows
        self.gguf: GGUFWeight | None = None

    def quantize_head(self, make: KernelFactory) -> None:
        self.head_kernel = make(self.weight, None)

    def load_gguf(self, weight: GGUFWeight, part: object = None) -> None:
        """Lookups read the dequantized rows; the blocks stay for the LM head (`attach_gguf`)."""
        self._load(self.weight, weight.dequantize())
        self.gguf = weight

    def attach_gguf(self) -> bool:
        weight, self.gguf = self.gguf, None
        if weight is None or self.vocab_size % self.tp.size:  # the last rank's rows would be short
            return False
        self.head_kernel = gguf_kernel([weight.take_rows(self.start, self.start + self.per_rank)], None)
        return True

    def _load(self, param: nn.Parameter, tensor: torch.Tensor, part: object = None) -> None:
        if tensor.shape != (self.vocab_size, param.shape[1]):
            raise ValueError(
                f"shape mismatch for {getattr(param, 'skiff_name', 'embedding')}: checkpoint {tuple(tensor.shape)}, "
                f"model expects {(self.vocab_size, param.shape[1])}"
            )
        rows = tensor[self.start : self.start + self.per_rank]
        param.data.zero_()
        param.data[: rows.shape[0]].copy_(rows)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.per_rank)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return all_reduce(out.masked_fill(outside.unsqueeze(-1), 0), self.tp)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, dim] -> [N, vocab] full logits on every rank."""
        local = self.head_kernel(hidden) if self.head_kernel is not None else F.linear(hidden, self.weight)
        return all_gather_last_dim(local, self.tp)[..., : self.vocab_size]


def attach_gguf_kernels(model: nn.Module) -> int:
    """After loading: every layer that took GGUF blocks computes on them; returns how many do."""
    count = 0
    for module in model.modules():
        if isinstance(module, ColumnParallelLinear | RowParallelLinear):
            count += module.attach_gguf()
    head = getattr(model, "lm_head", None)
    if isinstance(head, VocabParallelEmbedding):
        count += head.attach_gguf()
    for module in model.modules():  # an untied input embedding keeps only its float rows
        if isinstance(module, VocabParallelEmbedding):
            module.gguf = None
    return count


def quantize_linears(model: nn.Module, make: KernelFactory) -> int:
    """Swap every linear layer's matmul (and the LM head's) for a kernel from `make`; returns the count.

    Linears release their weights; the head keeps its rows, which a tied embedding still looks up.
    """
    count = 0
    for module in model.modules():
        if isinstance(module, ColumnParallelLinear | RowParallelLinear):
            module.quantize(make)
            count += 1
    head = getattr(model, "lm_head", None)
    if isinstance(head, VocabParallelEmbedding):
        head.quantize_head(make)
        count += 1
    return count

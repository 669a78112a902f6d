"""Tensor-parallel state: this process's rank and world size, and the collectives the layers call.

`tp_info()` is the state in force while a model is being built; each parallel layer keeps the TPInfo it
was built with and passes it to the collectives, so a tp=1 engine can live beside a tp>1 one in a process.
With tp == 1 every collective is a no-op, so single-process runs never touch torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPInfo:
    rank: int = 0
    size: int = 1


_TP = TPInfo()


def tp_info() -> TPInfo:
    return _TP


def init_tensor_parallel(rank: int, size: int, port: int, device: torch.device) -> None:
    global _TP
    _TP = TPInfo(rank, size)
    if size == 1:
        return
    if dist.is_initialized():
        raise RuntimeError("a tensor-parallel engine is already live in this process; shut it down first")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)


def destroy_tensor_parallel() -> None:
    global _TP
    if dist.is_initialized():
        dist.destroy_process_group()
    _TP = TPInfo()


def all_reduce(x: torch.Tensor, tp: TPInfo) -> torch.Tensor:
    if tp.size > 1:
        dist.all_reduce(x)
    return x


def all_gather_last_dim(x: torch.Tensor, tp: TPInfo) -> torch.Tensor:
    if tp.size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def shard_range(total: int, rank: int | None = None, size: int | None = None) -> tuple[int, int]:
    """[start, end) of this rank's even share of `total` rows (total must divide evenly)."""
    rank = _TP.rank if rank is None else rank
    size = _TP.size if size is None else size
    if total % size:
        raise ValueError(f"cannot split {total} evenly over tensor-parallel size {size}")
    per = total // size
    return rank * per, (rank + 1) * per

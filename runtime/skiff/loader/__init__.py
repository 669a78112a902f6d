"""Weight loading: map HF tensor names onto Skiff parameters and let each parameter take its TP slice."""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from skiff.layers.gguf_quant import GGUFWeight
from skiff.layers.linear import ColumnParallelLinear
from skiff.loader.checkpoint import CheckpointError, iter_tensors, read_config, resolve_model_path

__all__ = ["CheckpointError", "iter_tensors", "load_weights", "read_config", "resolve_model_path"]

# HF suffix -> (Skiff suffix, fused part)
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)\.(weight|bias)$")


def _target(name: str) -> tuple[str, int | None] | None:
    name = name.removeprefix("model.")
    if "rotary_emb" in name:
        return None
    m = _LAYER.match(name)
    if m and m.group(2) in _FUSED:
        module, part = _FUSED[m.group(2)]
        return f"layers.{m.group(1)}.{module}.{m.group(3)}", part
    return name, None


def load_weights(
    model: nn.Module, tensors: Iterable[tuple[str, torch.Tensor | GGUFWeight]], tied: bool
) -> None:
    """Copy each tensor into its parameter; GGUF blocks go to their layer's `load_gguf` where it has one."""
    params = dict(model.named_parameters(remove_duplicate=False))
    for pname, p in params.items():
        p.skiff_name = pname  # type: ignore[attr-defined]
    expected: set[tuple[str, int | None]] = set()
    for pname in params:
        if tied and pname.startswith("lm_head."):
            continue
        owner = model.get_submodule(pname.rsplit(".", 1)[0])
        if isinstance(owner, ColumnParallelLinear):
            expected.update((pname, part) for part in range(len(owner.full_sizes)))
        else:
            expected.add((pname, None))
    loaded: set[tuple[str, int | None]] = set()
    for name, tensor in tensors:
        target = _target(name)
        if target is None:
            continue
        pname, part = target
        if tied and pname.startswith("lm_head."):
            continue
        if pname not in params:
            raise CheckpointError(
                f"checkpoint tensor {name} has no place in the model (unexpected for this architecture)"
            )
        param = params[pname]
        if isinstance(tensor, GGUFWeight):
            owner = model.get_submodule(pname.rsplit(".", 1)[0])
            if pname.endswith(".weight") and hasattr(owner, "load_gguf"):
                try:
                    owner.load_gguf(tensor, part)
                except ValueError as e:
                    raise CheckpointError(f"{name}: {e}") from e
                loaded.add((pname, part))
                continue
            tensor = tensor.dequantize().to(param.dtype)
        loader = getattr(param, "weight_loader", None)
        if loader is None:
            if tuple(param.shape) != tuple(tensor.shape):
                raise CheckpointError(
                    f"shape mismatch for {name}: checkpoint {tuple(tensor.shape)}, model expects {tuple(param.shape)}"
                )
            param.data.copy_(tensor)
        else:
            try:
                loader(param, tensor, part)
            except ValueError as e:
                raise CheckpointError(f"{name}: {e}") from e
        loaded.add((pname, part))
    missing = sorted(f"{n}" + ("" if p is None else f"[part {p}]") for n, p in expected - loaded)
    if missing:
        raise CheckpointError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:5]}")

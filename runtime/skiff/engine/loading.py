"""From an EngineConfig to a loaded ModelRunner on one TP rank (rank 0 and the followers alike)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from skiff.config import EngineConfig
from skiff.distributed.parallel import init_tensor_parallel
from skiff.engine.host_memory import retain_freed_heap
from skiff.engine.model_runner import ModelRunner, resolve_device, resolve_dtype
from skiff.layers.quant import resolve_quantization
from skiff.loader import read_config, resolve_model_path
from skiff.loader.checkpoint import gguf_as_hf_dir
from skiff.models import ModelConfig
from skiff.tokenizer import cache_dir


def is_gguf(path: Path) -> bool:
    return path.is_file() and path.suffix == ".gguf"


def checkpoint_dir(cfg: EngineConfig, native: bool = False) -> tuple[Path, Path]:
    """(original model path, path to load weights from): GGUF files load through a converted cache
    (dequantized, or with `native` the blocks Skiff computes on)."""
    path = resolve_model_path(cfg.model)
    if is_gguf(path):
        return path, gguf_as_hf_dir(path, cache_dir(), native=native) or path
    return path, path


def load_runner(cfg: EngineConfig, rank: int, dist_port: int | None) -> ModelRunner:
    device = resolve_device(cfg)
    if device.type == "cuda" and cfg.tp > 1:
        device = torch.device("cuda", rank)
    if device.type == "cpu":
        torch.set_num_threads(cfg.num_threads or max(1, torch.get_num_threads() // cfg.tp))
        retain_freed_heap()
    init_tensor_parallel(rank, cfg.tp, dist_port or 0, device)
    dtype = resolve_dtype(cfg, device)
    gguf = is_gguf(resolve_model_path(cfg.model))
    quantization = resolve_quantization(cfg.quantization, gguf, device, dtype)
    model_path, weights = checkpoint_dir(cfg, native=quantization == "gguf")
    raw = read_config(weights)
    runner = ModelRunner(cfg, weights, raw, ModelConfig.from_hf(raw), device, dtype, quantization)
    runner.model_path, runner.weights_path = model_path, weights
    return runner


def eos_token_ids(model_cfg: ModelConfig, weights: Path) -> list[int]:
    """The config's end-of-sequence ids together with generation_config.json's."""
    ids = set(model_cfg.eos_token_ids)
    gen = weights / "generation_config.json" if weights.is_dir() else None
    if gen is not None and gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return sorted(ids)

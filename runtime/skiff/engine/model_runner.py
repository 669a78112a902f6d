"""ModelRunner: builds the model on its device, loads weights, owns the KV pool and runs forwards."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from skiff.attention.registry import get_backend, resolve_backend
from skiff.config import EngineConfig
from skiff.distributed.parallel import tp_info
from skiff.engine.cuda_graph import DecodeGraphs
from skiff.engine.forward_batch import ForwardBatch
from skiff.kernels import cpu as cpu_kernels
from skiff.kvcache.pool import KVPool
from skiff.layers.gguf_quant import GGUFWeight
from skiff.layers.linear import attach_gguf_kernels, quantize_linears
from skiff.layers.quant import QUANTIZATIONS, check_supported
from skiff.loader import iter_tensors, load_weights
from skiff.loader.dummy import init_dummy_weights
from skiff.models import ModelConfig, build_model
from skiff.models.decode_stack import DecodeStack

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(cfg: EngineConfig) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def resolve_dtype(cfg: EngineConfig, device: torch.device) -> torch.dtype:
    if cfg.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[cfg.dtype]


def kv_cache_dtype(name: str, dtype: torch.dtype, quantization: str | None) -> torch.dtype:
    """The KV pool's dtype: "auto" is the model's, except on a GGUF's own blocks (a CPU fp32 model), where it is
    fp16 as in llama.cpp: half the bytes a decode step's attention reads, and the greedy tokens' agreement with
    the fp32 reference unchanged (docs/performance.md)."""
    if name != "auto":
        return DTYPES[name]
    return torch.float16 if quantization == "gguf" else dtype


class ModelRunner:
    def __init__(
        self,
        cfg: EngineConfig,
        path: Path,
        raw_cfg: dict[str, Any],
        model_cfg: ModelConfig,
        device: torch.device,
        dtype: torch.dtype,
        quantization: str | None = None,
    ) -> None:
        if device.type == "cuda":
            if device.index is None:  # set_device and the CUDA graph pool need an explicit index
                device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(device)
        self.cfg, self.model_cfg, self.device, self.dtype = cfg, model_cfg, device, dtype
        self.quantization = quantization
        self.model_path = self.weights_path = path
        with torch.device(device):
            model = build_model(model_cfg)
        cos_sin = model.rotary.cos_sin  # built in fp32: keep that copy, not one rounded through `dtype`
        model.to(dtype)
        model.rotary.cos_sin = cos_sin
        if cfg.load_format == "dummy":
            init_dummy_weights(model, cfg.seed, raw_cfg.get("initializer_range", 0.02))
        else:
            native = quantization == "gguf"
            tensors = (
                (n, t if isinstance(t, GGUFWeight) else t.to(dtype))
                for n, t in iter_tensors(path, raw_cfg, native=native)
            )
            load_weights(model, tensors, model_cfg.tie_word_embeddings)
            if native:
                log.info("gguf: %d linear layers compute on the file's blocks", attach_gguf_kernels(model))
        if quantization in QUANTIZATIONS:
            check_supported(quantization, device, dtype)
            count = quantize_linears(model, QUANTIZATIONS[quantization])
            log.info("%s: quantized %d linear layers", quantization, count)
        self.model = model.eval()
        if (
            device.type == "cpu" and dtype == torch.float32
        ):  # build or load them now, not inside the first request
            log.info("CPU kernels: %s", "on" if cpu_kernels.available() else "off (pure-torch ops)")
        attn = model.layers[0].self_attn
        self.num_heads, self.num_kv_heads = attn.num_heads, attn.num_kv_heads
        self.kv_dtype = kv_cache_dtype(cfg.kv_cache_dtype, dtype, quantization)
        if self.kv_dtype != dtype and device.type != "cpu":
            raise ValueError(
                "--kv-cache-dtype other than the model's dtype is a CPU path (the torch backend)"
            )
        self.num_pages = self._num_pages()
        self.pool = KVPool(
            model_cfg.num_layers,
            self.num_pages,
            cfg.page_size,
            self.num_kv_heads,
            model_cfg.head_dim,
            self.kv_dtype,
            device,
            compute_dtype=dtype,
        )
        backend = get_backend(resolve_backend(cfg.attention_backend, device))
        self.backend = backend(self.pool, self.num_heads, self.num_kv_heads, model_cfg.head_dim)
        self.decode_stack = DecodeStack.build(self.model, self.backend)
        self.graphs: DecodeGraphs | None = None
        if (
            device.type == "cuda"
            and cfg.cuda_graph_max_bs > 0
            and self.backend.supports_cuda_graphs
            and tp_info().size == 1
        ):
            max_context = min(cfg.context_length or model_cfg.max_position, model_cfg.max_position)
            self.graphs = DecodeGraphs(
                self.model,
                self.backend,
                device,
                min(cfg.cuda_graph_max_bs, cfg.max_running_requests),
                min(-(-max_context // cfg.page_size), self.num_pages),
            )
            self.graphs.capture()

    def _num_pages(self) -> int:
        per_token = KVPool.bytes_per_token(
            self.model_cfg.num_layers, self.num_kv_heads, self.model_cfg.head_dim, self.kv_dtype
        )
        if self.cfg.max_total_tokens is not None:
            tokens = self.cfg.max_total_tokens
        elif self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            tokens = int(free * self.cfg.mem_fraction) // per_token
        else:
            tokens = int(self.cfg.cpu_kv_cache_gb * 2**30) // per_token
        pages = tokens // self.cfg.page_size + 1  # page 0 is the padding page
        if tp_info().size > 1:  # every rank must size its pool identically
            t = torch.tensor([pages], device=self.device if self.device.type == "cuda" else "cpu")
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
            pages = int(t.item())
        if pages < 2:
            raise ValueError(f"KV cache budget holds no page of {self.cfg.page_size} tokens")
        return pages

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if self.graphs is not None and self.graphs.can_run(batch):
            return self.graphs.replay(batch)
        if self.decode_stack is not None and batch.is_decode:
            hidden = self.decode_stack(batch)
        else:
            self.backend.prepare(batch)
            hidden = self.model(batch.input_ids, batch.positions, self.backend)
        return self.model.compute_logits(hidden.index_select(0, batch.logit_rows))

"""Engine configuration: one dataclass that the CLI, the offline API and the server all fill."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal, get_args

DType = Literal["auto", "float32", "bfloat16", "float16"]
DTYPE_NAMES: tuple[str, ...] = get_args(DType)
LoadFormat = Literal["auto", "dummy"]  # dummy: random weights for the config.json's model, no checkpoint read
LOAD_FORMATS: tuple[str, ...] = get_args(LoadFormat)
Quantization = Literal["auto", "none", "gguf", "int8"]
QUANTIZATION_NAMES: tuple[str, ...] = get_args(Quantization)


@dataclass
class EngineConfig:
    model: str | None = None  # HF directory, .gguf file, or None for the embedded SmolLM2-135M-Instruct
    tokenizer: str | None = None  # defaults to the model's own
    served_model_name: str | None = None
    dtype: DType = "auto"  # fp32 on CPU, bf16 on GPU
    load_format: LoadFormat = "auto"
    # "auto": a GGUF's own blocks on CPU fp32 ("gguf"), else float weights; "none": float weights; "int8":
    # int8 weights and activations on CPU (skiff.layers.quant). None means "none".
    quantization: str | None = "auto"
    kv_cache_dtype: DType = (
        "auto"  # the KV pool's dtype; "auto": the model's (fp16 on a GGUF's own blocks). Others: CPU only
    )
    device: str = "auto"  # "cpu", "cuda" or "auto"
    tp: int = 1
    page_size: int = 16
    max_running_requests: int = 256
    chunked_prefill_size: int = 8192  # prefill token budget of one step
    max_total_tokens: int | None = None  # KV pool size in tokens; None: from the memory budget
    mem_fraction: float = 0.85  # GPU: share of the memory left after weights that the KV pool takes
    cpu_kv_cache_gb: float = 2.0  # CPU: the KV pool's memory budget
    context_length: int | None = None  # defaults to the model's max_position_embeddings
    cache: Literal["radix", "naive"] = "radix"
    schedule_policy: Literal["fcfs", "priority"] = "fcfs"
    attention_backend: str = "auto"  # "torch", "flashinfer" or "auto"
    cuda_graph_max_bs: int = 256  # 0 disables CUDA graphs
    disable_overlap: bool = field(
        default_factory=lambda: os.environ.get("SKIFF_DISABLE_OVERLAP_SCHEDULING") == "1"
    )
    null_engine: bool = (
        False  # benchmarks: steps cost nothing (skiff.engine.null), the serving layer's ceiling
    )
    overlap_on_cpu: bool = False  # run the overlap (lag 1) loop on CPU too: no gain there, it tests that path
    num_threads: int | None = None  # CPU threads for torch; None: all cores
    seed: int = 0
    dist_port: int | None = None  # rendezvous port for tp > 1; None: pick a free one

    def __post_init__(self) -> None:
        if self.tp not in (1, 2, 4, 8):
            raise ValueError(f"tp must be 1, 2, 4 or 8, got {self.tp}")
        if not 1 <= self.page_size <= 256:
            raise ValueError(f"page_size must be in [1, 256], got {self.page_size}")
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if self.chunked_prefill_size < 16:
            raise ValueError(f"chunked_prefill_size must be >= 16, got {self.chunked_prefill_size}")
        if not 0.0 < self.mem_fraction < 1.0:
            raise ValueError(f"mem_fraction must be in (0, 1), got {self.mem_fraction}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(
                f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}"
            )
        if self.quantization not in (None, *QUANTIZATION_NAMES):
            raise ValueError(
                f"quantization must be one of {', '.join(QUANTIZATION_NAMES)}, got {self.quantization!r}"
            )
        if self.kv_cache_dtype not in DTYPE_NAMES:
            raise ValueError(
                f"kv_cache_dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.kv_cache_dtype!r}"
            )
        if self.cuda_graph_max_bs < 0:
            raise ValueError(f"cuda_graph_max_bs must be >= 0, got {self.cuda_graph_max_bs}")

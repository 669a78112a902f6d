"""What the GPU tests run on: the device (a CUDA GPU with FlashInfer, or with SKIFF_GPU_TESTS_ON_CPU=1 the CPU
with the torch attention backend, fp32 and tiny shapes, so that the tests' own code can be run anywhere),
Skiff's engine on the fast path (FlashInfer, CUDA graphs, overlap scheduling), and one model held by both
Skiff and HF transformers: HF's random initialisation saved as safetensors, which Skiff loads as a checkpoint.

The model shapes, the engine options and the agreement measures are the benchmarks' (benchmarks/harness.py,
benchmarks/hf_reference.py): the tests assert on the same numbers agreement_floor.py reports.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import hf_reference as ref  # noqa: E402
from harness import Bench, engine_options, generate  # noqa: E402

ON_CPU = os.environ.get("SKIFF_GPU_TESTS_ON_CPU") == "1"
BENCH = Bench(cpu=ON_CPU)
N_PROMPTS, N_NEW = (8, 16) if ON_CPU else (20, 128)
PROMPT_LENS = (32, 64) if ON_CPU else (32, 400)
PREFILL_PROMPTS = 4  # the prompts whose prefill logits are compared
# (shape, dtype): (strict teacher-forced agreement with HF, agreement counting near-ties) at least; see
# test_hf_agreement.py for the measurements they come from
BARS = {
    ("qwen3_0_6b", "bfloat16"): (0.96, 0.99),
    ("llama_3_2_1b", "bfloat16"): (0.90, 0.97),
    ("llama_3_2_1b", "float16"): (0.98, 0.995),
}
# Prefill argmax over every prompt row sits a little under decode's strict agreement: on an H100
# (2026-12-06) Qwen3-0.6B bf16 gave 0.9588 where teacher-forced decode passed its 0.96 bar.
PREFILL_SLACK = 0.015


def _missing() -> str | None:
    if ON_CPU:
        return None
    if not torch.cuda.is_available():
        return "no CUDA device (SKIFF_GPU_TESTS_ON_CPU=1 runs these tests on the CPU, tiny shapes)"
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return "flashinfer is not installed"
    return None


MISSING = _missing()
requires_device = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
gpu_only = pytest.mark.skipif(ON_CPU, reason="CUDA graphs and FlashInfer: GPU only")


def torch_dtype(name: str) -> torch.dtype:
    """The dtype a test names; on the CPU everything runs in fp32."""
    return torch.float32 if ON_CPU else getattr(torch, name)


@dataclass
class Run:
    """One engine's greedy tokens over the prompts, once per pass (later passes hit the radix cache)."""

    passes: list[ref.Trajectories]
    cache_hit_tokens: list[int]  # per pass
    prompt_logits: ref.Preds  # prefill logits of the first PREFILL_PROMPTS prompts, on the host
    lag: int
    graphs: bool
    backend: str

    @property
    def tokens(self) -> ref.Trajectories:
        return self.passes[0]


def run_engine(
    path: Path, dtype: torch.dtype, prompts: ref.Trajectories, passes: int = 1, **overrides: Any
) -> Run:
    from skiff.config import EngineConfig
    from skiff.engine.engine import Engine
    from skiff.params import SamplingParams

    options = engine_options(path, BENCH, dtype=str(dtype).removeprefix("torch."), **overrides)
    total_tokens = 20_000 if ON_CPU else 200_000
    engine = Engine(EngineConfig(**options, max_total_tokens=total_tokens, context_length=4096))
    try:
        greedy = [SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True)] * len(prompts)
        out, hits = [], []
        for _ in range(passes):
            before = engine.stats().cache_hit_tokens
            out.append(generate(engine, prompts, greedy))
            hits.append(engine.stats().cache_hit_tokens - before)
        engine.check_integrity()
        logits = [engine.prefill_logits(p).float().cpu() for p in prompts[:PREFILL_PROMPTS]]
        return Run(
            out,
            hits,
            logits,
            engine.lag,
            engine.runner.graphs is not None,
            type(engine.runner.backend).__name__,
        )
    finally:
        engine.shutdown()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the next engine sizes nothing from free memory, but HF allocates


@dataclass
class Reference:
    """One random-weight model in HF and Skiff, Skiff's default run over it, and HF teacher-forced over that."""

    shape: str
    dtype: torch.dtype
    path: Path
    prompts: ref.Trajectories
    hf: Any
    base: Run
    hf_preds: ref.Preds = field(repr=False)


def build_reference(shape: str, dtype: torch.dtype, path: Path) -> Reference:
    from harness import hf_config

    hf = ref.random_weights_model(hf_config(shape, ON_CPU), path, BENCH.device, dtype)
    prompts = ref.random_prompts(N_PROMPTS, *PROMPT_LENS, hf.config.vocab_size)
    base = run_engine(path, dtype, prompts, passes=2)
    return Reference(shape, dtype, path, prompts, hf, base, ref.teacher_forced(hf, prompts, base.tokens))

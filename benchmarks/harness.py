"""The small harness every GPU benchmark runs on: timed sections writing $OUT/results.json as they finish,
model shapes (benchmarks/model_shapes.json, real transformers config fields), random-weight model folders,
engines on the fast path with fallbacks, and the anchors' offline workload.

A `Bench` carries the device choice: on the GPU bf16 with FlashInfer; with `cpu=True` the same code on tiny
shapes, fp32 and the torch attention backend (a self-test of the scripts on a machine without a GPU).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

SHAPES: dict[str, dict[str, Any]] = json.loads(Path(__file__).with_name("model_shapes.json").read_text())
TINY = SHAPES.pop("tiny")  # the overrides that make any shape a seconds-on-CPU model of the same kind
_request_ids = itertools.count()


def out_dir() -> Path:
    path = Path(os.environ.get("OUT") or Path(tempfile.gettempdir()) / "skiff_gpu_out")
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    return Path(os.environ.get("SKIFF_BENCH_MODELS") or Path(tempfile.gettempdir()) / "skiff_bench_models")


@dataclass
class Bench:
    cpu: bool = False
    budget_s: float | None = None  # seconds after the start past which sections are skipped
    results: dict[str, Any] = field(default_factory=dict)
    t_start: float = field(default_factory=time.perf_counter)

    @property
    def device(self) -> str:
        return "cpu" if self.cpu else "cuda"

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32 if self.cpu else torch.bfloat16

    def elapsed(self) -> float:
        return time.perf_counter() - self.t_start

    def log(self, *args: Any) -> None:
        print(f"[{self.elapsed():7.1f}s]", *args, flush=True)

    def save(self) -> None:
        out = out_dir()
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(self.results, indent=1, default=str))

    def section(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run fn and record its result or its traceback; one broken section must not cost the rest of the
        run. Past the time budget the section is recorded as skipped."""
        if self.budget_s is not None and self.elapsed() > self.budget_s:
            self.results[name] = {"skipped": f"time budget {self.budget_s:.0f}s spent"}
            self.log(f"== {name}: skipped (budget)")
            self.save()
            return None
        self.log(f"== {name}")
        t0 = time.perf_counter()
        value = None
        try:
            value = fn(*args, **kwargs)
            self.results[name] = value
        except Exception as exc:
            self.results[name] = {"error": repr(exc), "traceback": traceback.format_exc()}
            self.log(f"!! {name} failed: {exc!r}\n{traceback.format_exc()}")
        if isinstance(self.results[name], dict):
            self.results[name]["section_seconds"] = round(time.perf_counter() - t0, 1)
        self.save()
        return value

    def sync(self) -> None:
        if not self.cpu:
            torch.cuda.synchronize()


def script_args(
    doc: str, add: Callable[[argparse.ArgumentParser], Any] | None = None
) -> tuple[Bench, argparse.Namespace]:
    """A benchmark script's command line: --cpu (the self-test) and what add() puts on the parser."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="self-test on tiny shapes, torch backend")
    if add is not None:
        add(ap)
    args = ap.parse_args()
    return Bench(cpu=args.cpu), args


def require_modules(*modules: str) -> None:
    """Exit at once, naming what is missing, when a module the script's children import does not load here:
    a device run otherwise spends its minutes before the first server start fails."""
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)"
    done = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        sys.exit(f"preflight: importing {', '.join(modules)} failed:\n{done.stderr[-1500:]}")


def shape_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--shape", default="qwen3_0_6b", help="a model shape of model_shapes.json")


# ---------------------------------------------------------------------------------------------- models
def hf_config(shape: str, tiny: bool, **overrides: Any) -> Any:
    """The transformers config of a named shape; tiny: the same kind of model in a few MB."""
    import transformers

    spec = {**SHAPES[shape], **(TINY if tiny else {}), **overrides}
    return transformers.AutoConfig.for_model(spec.pop("model_type"), **spec)


def config_only_dir(shape: str, bench: Bench, **overrides: Any) -> Path:
    """A model folder holding config.json alone: engines load it with load_format="dummy"."""
    path = models_dir() / f"{shape}{'_tiny' if bench.cpu else ''}_config_only"
    path.mkdir(parents=True, exist_ok=True)
    hf_config(shape, bench.cpu, **overrides).save_pretrained(path)
    return path


def free(*engines: Any) -> None:
    """Shut engines down and give their memory back before the next one sizes its KV pool."""
    for engine in engines:
        engine.shutdown()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def engine_options(path: Path, bench: Bench, **overrides: Any) -> dict[str, Any]:
    """EngineConfig fields of the fast path (FlashInfer, CUDA graphs, overlap), or the CPU self-test's."""
    options: dict[str, Any] = dict(
        model=str(path),
        device=bench.device,
        dtype=str(bench.dtype).removeprefix("torch."),
        attention_backend="torch" if bench.cpu else "flashinfer",
        page_size=16,
        seed=0,
        overlap_on_cpu=bench.cpu,  # the CPU self-test runs the overlap loop too
    )
    return options | overrides


def make_engine(path: Path, bench: Bench, **overrides: Any) -> tuple[Any, dict[str, Any]]:
    """An engine on the fast path; if that cannot be built, the same without graphs, then with the torch
    backend, so one broken piece still leaves numbers for the rest.
    Returns the engine and {"config": what it was built with, "fallbacks": the errors on the way}."""
    from skiff.config import EngineConfig
    from skiff.engine.engine import Engine

    base = engine_options(path, bench, **overrides)
    attempts = [
        base,
        dict(base, cuda_graph_max_bs=0),
        dict(base, cuda_graph_max_bs=0, attention_backend="torch"),
    ]
    errors: list[str] = []
    free()
    for kwargs in attempts[: 1 if bench.cpu else None]:
        try:
            engine = Engine(EngineConfig(**kwargs))
        except Exception as exc:
            label = f"{kwargs['attention_backend']}/graphs={kwargs.get('cuda_graph_max_bs', 'default')}"
            errors.append(f"{label}: {exc!r}")
            bench.log("!! engine build failed, falling back:", traceback.format_exc())
            free()
            continue
        return engine, {"config": {k: v for k, v in kwargs.items() if k != "model"}, "fallbacks": errors}
    raise RuntimeError(f"no engine could be built: {errors}")


def generate(engine: Any, prompts: list[list[int]], params: list[Any]) -> list[list[int]]:
    """Every prompt's generated tokens, all requests in the engine at once."""
    out: dict[str, list[int]] = {}
    for prompt, sp in zip(prompts, params, strict=True):
        rid = f"bench{next(_request_ids)}"
        engine.add_request(rid, prompt, sp)
        out[rid] = []
    while engine.has_work:
        for o in engine.step():
            if o.rid in out:
                out[o.rid].extend(o.token_ids)
    return list(out.values())


# ---------------------------------------------------------------------------------------------- workload
def offline_workload(bench: Bench) -> tuple[list[list[int]], list[int], list[Any]]:
    """The anchors' offline set (256 sequences, prompts and outputs 100-1024, T=0.6, EOS ignored), or 8 short
    sequences in the CPU self-test: (prompts, output lengths, sampling parameters)."""
    from skiff.bench.offline import OfflineWorkload
    from skiff.params import SamplingParams

    wl = OfflineWorkload()
    if bench.cpu:
        wl = OfflineWorkload(
            num_seqs=8, min_input_len=10, max_input_len=60, min_output_len=5, max_output_len=30
        )
    prompts, outs = wl.build()
    params = [SamplingParams(max_tokens=n, temperature=wl.temperature, ignore_eos=True) for n in outs]
    return prompts, outs, params


def warm_up(engine: Any, prompts: list[list[int]], tokens: int) -> None:
    from skiff.params import SamplingParams

    generate(engine, prompts[:4], [SamplingParams(max_tokens=tokens, temperature=0.6, ignore_eos=True)] * 4)


def pick(values: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: values[k] for k in keys if k in values}

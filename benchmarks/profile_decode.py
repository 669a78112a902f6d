"""Where one decode step's time goes: steady-state decode at batch 256 (contexts ~450-880) on random weights,
GPU kernel time by category (torch profiler) and host time per phase of the engine's step (schedule,
launch, complete, the runner's forward enqueue); also the wall time of the prefill phase before it.

    python3 benchmarks/profile_decode.py [--cpu] [--shape qwen3_0_6b]
"""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from harness import Bench, config_only_dir, free, make_engine, out_dir, script_args, shape_arg, warm_up

STEPS = 30
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [  # first match wins, on the lower-cased kernel name
    ("attention", ("prefill", "decode", "attention", "mha", "batchprefill")),
    ("gemm", ("gemm", "cutlass", "sm90", "nvjet", "xmma", "cublas", "matmul")),
    ("norm", ("norm",)),
    ("rope", ("rope", "rotary")),
    ("silu_and_mul", ("act_and_mul", "silu")),
    ("sampling (softmax/argmax/exp)", ("softmax", "argmax", "exponential", "reduce", "max")),
    ("copy/memset", ("memcpy", "memset", "copy")),
]


def category(kernel: str) -> str:
    k = kernel.lower()
    if "index" in k and "copy" in k:
        return "kv_write (index_copy)"
    return next((name for name, keys in CATEGORIES if any(s in k for s in keys)), "other")


def time_calls(obj: Any, attr: str, key: str, host: dict[str, list[float]]) -> None:
    """Replace obj.attr by a wrapper that appends each call's wall time to host[key]."""
    fn: Callable[..., Any] = getattr(obj, attr)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            host[key].append(time.perf_counter() - t0)

    setattr(obj, attr, wrapper)


def kernel_table(prof: Any, skip: set[str]) -> dict[str, Any]:
    cats: dict[str, float] = defaultdict(float)
    top = []
    for ev in prof.key_averages():
        dev_us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if not dev_us or ev.key.startswith(("cuda", "aten::", "ProfilerStep")) or ev.key in skip:
            continue
        cats[category(ev.key)] += dev_us / 1e3 / STEPS
        top.append((round(dev_us / 1e3 / STEPS, 3), ev.key[:90]))
    top.sort(reverse=True)
    return {
        "gpu_ms_per_step_by_category": {k: round(v, 3) for k, v in sorted(cats.items(), key=lambda x: -x[1])},
        "gpu_ms_per_step_total": round(sum(cats.values()), 3),
        "top_kernels_ms_per_step": top[:15],
    }


def profile_section(bench: Bench, shape: str, trace: str = "decode_profile_trace.json") -> dict[str, Any]:
    from skiff.params import SamplingParams

    rng = random.Random(3)
    n = 8 if bench.cpu else 256
    prompts = [
        [rng.randint(0, 9999) for _ in range(20 if bench.cpu else rng.randint(400, 800))] for _ in range(n)
    ]
    params = SamplingParams(max_tokens=80, temperature=0.6, ignore_eos=True)  # outlasts the measured steps
    engine, info = make_engine(
        config_only_dir(shape, bench),
        bench,
        load_format="dummy",
        page_size=256,
        chunked_prefill_size=16384,
        context_length=4096,
        cuda_graph_max_bs=0 if bench.cpu else 256,
    )
    host: dict[str, list[float]] = defaultdict(list)
    try:
        warm_up(engine, prompts, 4)
        for i, p in enumerate(prompts):
            engine.add_request(f"prof{i}", p, params)
        bench.sync()
        t_prefill, prefill_steps = time.perf_counter(), 0
        sched = engine.scheduler
        while sched.waiting or any(r.remaining > 1 or not r.output_ids for r in sched.running):
            engine.step()  # prefill everything first
            prefill_steps += 1
        bench.sync()
        prefill_wall = time.perf_counter() - t_prefill
        for _ in range(5):
            engine.step()
        time_calls(sched, "schedule", "schedule", host)
        time_calls(engine, "_launch", "launch (plan + enqueue forward + sample)", host)
        time_calls(engine, "_complete", "complete (wait for tokens + bookkeeping)", host)
        time_calls(engine.runner, "forward", "runner.forward (enqueue)", host)
        prof = None
        if not bench.cpu:
            from torch.profiler import ProfilerActivity, profile

            prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            bench.sync()
            prof.__enter__()
        t0 = time.perf_counter()
        for _ in range(STEPS):
            engine.step()
        bench.sync()
        wall = time.perf_counter() - t0
        tokens = sum(map(len, prompts))
        res: dict[str, Any] = {
            **info,
            "prefill_phase": {
                "prompt_tokens": tokens,
                "steps": prefill_steps,
                "wall_s": round(prefill_wall, 3),
                "tok_s": round(tokens / prefill_wall),
            },
            "batch": len(sched.running),
            "steps": STEPS,
            "wall_ms_per_step": round(wall / STEPS * 1e3, 3),
            "host_ms_per_step": {k: round(sum(v) / STEPS * 1e3, 3) for k, v in host.items()},
        }
        if prof is not None:
            prof.__exit__(None, None, None)
            res.update(kernel_table(prof, set(host)))
            prof.export_chrome_trace(str(out_dir() / trace))
        while engine.has_work:
            engine.step()
        return res
    finally:
        free(engine)


def main() -> None:
    bench, args = script_args(__doc__, shape_arg)
    bench.section("profile_decode", profile_section, bench, args.shape)
    print(json.dumps(bench.results, indent=1, default=str))


if __name__ == "__main__":
    main()

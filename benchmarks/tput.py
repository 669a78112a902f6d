"""Offline throughput on the anchors' workload, random weights (load_format="dummy"), and its memory floor.

Workload: 256 sequences, prompts 100-1024 random ids, outputs 100-1024, T=0.6, EOS ignored; page 256,
prefill budget 16384, context 4096, CUDA graphs to batch 256. Throughput = output tokens / wall time of one
generate call after a warm-up. The floor: the bytes a perfect engine must read, at the measured
device-to-device copy bandwidth (gpu_env.py).

    python3 benchmarks/tput.py [--cpu] [--shape qwen3_0_6b]
"""

from __future__ import annotations

import time
from typing import Any

from harness import (
    Bench,
    config_only_dir,
    free,
    generate,
    hf_config,
    make_engine,
    offline_workload,
    script_args,
    shape_arg,
    warm_up,
)

RUNS = {  # name: (label, engine options)
    "tput_overlap_graphs": ("overlap on, graphs on", {}),
    "tput_no_overlap": ("overlap off, graphs on", {"disable_overlap": True}),
    "tput_no_graphs": ("overlap on, graphs off", {"cuda_graph_max_bs": 0}),
}


def floor_seconds(
    config: Any, prompts: list[list[int]], outs: list[int], bandwidth_tbs: float
) -> dict[str, Any]:
    """Each decode step reads the KV of every live sequence, plus the weights once per step (all 256
    sequences fit in the pool at once, so the step count is the longest output); prefill is not counted."""
    layers, kv_heads, head_dim = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
    per_token = 2 * layers * kv_heads * head_dim * 2
    kv = sum(per_token * (len(p) * n + n * (n - 1) // 2) for p, n in zip(prompts, outs, strict=True))
    h, inter, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    q, kvw = config.num_attention_heads * head_dim, kv_heads * head_dim
    per_layer = h * (q + 2 * kvw) + q * h + 3 * h * inter
    weights = 2 * (layers * per_layer + vocab * h)  # the lm head every step; embedding rows are negligible
    steps = max(outs)
    return {
        "kv_bytes_tb": round(kv / 1e12, 2),
        "weight_bytes_gb": round(weights / 1e9, 2),
        "decode_steps": steps,
        "floor_s": round((kv + weights * steps) / (bandwidth_tbs * 1e12), 2),
    }


def tput_section(bench: Bench, shape: str, label: str, **overrides: Any) -> dict[str, Any]:
    prompts, outs, params = offline_workload(bench)
    t0 = time.perf_counter()
    options: dict[str, Any] = dict(
        load_format="dummy",
        page_size=256,
        chunked_prefill_size=16384,
        context_length=4096,
        cuda_graph_max_bs=0 if bench.cpu else 256,
        max_running_requests=256,
    )
    engine, info = make_engine(config_only_dir(shape, bench), bench, **(options | overrides))
    load_s = time.perf_counter() - t0
    try:
        warm_up(engine, prompts, 8)
        bench.sync()
        t0 = time.perf_counter()
        results = generate(engine, prompts, params)
        wall = time.perf_counter() - t0
        stats = engine.stats()
        engine.check_integrity()
        graphs = engine.runner.graphs
        tokens = sum(map(len, results))
        res: dict[str, Any] = {
            "label": label,
            **info,
            "wall_s": round(wall, 3),
            "output_tokens": tokens,
            "expected_tokens": sum(outs),
            "output_tok_s": round(tokens / wall, 1),
            "load_s": round(load_s, 1),
            "graph_capture_s": round(graphs.capture_seconds, 1) if graphs is not None else None,
            "kv_pool_tokens": stats.total_pages * stats.page_size,
            "preemptions": stats.num_preemptions,
            "overlap": engine.lag == 1,
        }
    finally:
        free(engine)
    bandwidth = (bench.results.get("env") or {}).get("copy_bandwidth_tbs") or 4.3
    res["floor"] = floor_seconds(hf_config(shape, bench.cpu), prompts, outs, bandwidth)
    res["fraction_of_floor"] = round(res["floor"]["floor_s"] / wall, 3)
    bench.log(f"   {label}: {res['output_tok_s']} tok/s in {wall:.2f}s (floor {res['floor']['floor_s']}s)")
    return res


def print_tput(results: dict[str, Any]) -> None:
    print(f"{'run':34} {'tok/s':>9} {'wall s':>7} {'floor%':>7} {'load s':>7} {'tokens':>8}")
    for name, r in results.items():
        if not name.startswith("tput") or not isinstance(r, dict):
            continue
        if "output_tok_s" not in r:
            print(f"{name:34} {r.get('error') or r.get('skipped')}"[:160])
            continue
        fallback = f"FALLBACK {r['fallbacks']}" if r["fallbacks"] else ""
        line = (
            f"{r['label'][:34]:34} {r['output_tok_s']:>9} {r['wall_s']:>7} "
            f"{100 * r['fraction_of_floor']:>6.1f}% {r['load_s']:>7} {r['output_tokens']:>8} {fallback}"
        )
        print(line[:220])
    on, off = results.get("tput_overlap_graphs") or {}, results.get("tput_no_overlap") or {}
    if "output_tok_s" in on and "output_tok_s" in off:
        print(f"overlap gain {on['output_tok_s'] / off['output_tok_s']:.3f}x")


def main() -> None:
    bench, args = script_args(__doc__, shape_arg)
    for name, (label, overrides) in RUNS.items():
        bench.section(name, tput_section, bench, args.shape, label, **overrides)
    print_tput(bench.results)


if __name__ == "__main__":
    main()

"""Every GPU measurement in one call on the device (device time is scarce), results in $OUT/results.json
as each section finishes and a short table printed last. The correctness checks are tests (tests/gpu).

Sections, in order (each guarded: a failure is recorded and the run goes on; `--only` picks some, env always):
  env              GPU, versions, device-to-device copy bandwidth                 (gpu_env.py)
  jit              FlashInfer modules compiled ahead in parallel threads          (gpu_env.py)
  fused_ops        the GPU fused-op providers vs HF's torch code: equality, time  (gpu_fused_ops.py)
  tput_*           the anchors' offline workload on the Qwen3-0.6B shape          (tput.py)
  agreement_floor  how far two correct bf16 runs disagree, Qwen3-0.6B and Llama-3.2-1B shapes (agreement_floor.py)
  serve            `skiff serve` under `skiff bench serve` at several rates       (gpu_serve.py)
  profile          where a decode step's time goes, batch 256                     (profile_decode.py)
  big              the Qwen3-8B shape: profile, then throughput with overlap on and off
  tput_overlap_graphs_run2   the first throughput run again, for the run-to-run spread
All models have random weights: the throughput runs load config.json alone (load_format="dummy").
`--cpu` runs the same sections on tiny shapes with the torch backend (a self-test of the scripts).

    python3 benchmarks/gpu_h200.py [--budget 520] [--only env,jit,tput_overlap_graphs] [--cpu]
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from agreement_floor import floor_section
from gpu_env import env_section, jit_section
from gpu_fused_ops import fused_ops_section
from gpu_serve import print_serve, rate_list, serve_section
from harness import Bench, pick
from profile_decode import profile_section
from tput import RUNS, print_tput, tput_section

PROFILE_KEYS = (
    "prefill_phase",
    "batch",
    "wall_ms_per_step",
    "gpu_ms_per_step_total",
    "gpu_ms_per_step_by_category",
    "host_ms_per_step",
    "error",
)


def _with_env(env: dict[str, str], call: Callable[[], Any]) -> Any:
    """call() with os.environ updated by env (read by the engine's parts as they are built), then restored."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return call()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def sections(bench: Bench, args: argparse.Namespace) -> list[tuple[str, str, Callable[[], Any]]]:
    """(name, the --only word that selects it, the call) in run order."""
    run: list[tuple[str, str, Callable[[], Any]]] = [("env", "env", lambda: env_section(bench))]
    if not bench.cpu:
        run += [
            ("jit", "jit", lambda: jit_section(bench, args.jit_skip)),
            ("fused_ops", "fused_ops", fused_ops_section),
        ]
    for name, (label, overrides) in RUNS.items():
        run.append((name, name, lambda lb=label, kw=overrides: tput_section(bench, "qwen3_0_6b", lb, **kw)))
    for shape in ("qwen3_0_6b", "llama_3_2_1b"):
        run.append((f"agreement_floor_{shape}", "agreement_floor", lambda s=shape: floor_section(bench, s)))
    serve = (args.serve_rates, args.serve_prompts, args.tokenizer)
    run += [
        ("serve", "serve", lambda: serve_section(bench, *serve)),
        ("profile_decode", "profile", lambda: profile_section(bench, "qwen3_0_6b")),
        (  # before the 8B throughput runs: the table comes before any change
            "profile_decode_qwen3_8b",
            "big",
            lambda: profile_section(bench, "qwen3_8b", "decode_profile_trace_8b.json"),
        ),
        ("tput_qwen3_8b", "big", lambda: tput_section(bench, "qwen3_8b", "Qwen3-8B shape, overlap+graphs")),
        (
            "tput_qwen3_8b_fa3",
            "big_fa3",
            lambda: _with_env(
                {"SKIFF_FLASHINFER_PREFILL": "fa3"},
                lambda: tput_section(bench, "qwen3_8b", "Qwen3-8B shape, overlap+graphs, sm90 prefill"),
            ),
        ),
        (
            "tput_qwen3_8b_no_overlap",
            "big",
            lambda: tput_section(bench, "qwen3_8b", "Qwen3-8B shape, overlap off", disable_overlap=True),
        ),
        (
            "tput_overlap_graphs_run2",
            "tput_overlap_graphs_run2",
            lambda: tput_section(bench, "qwen3_0_6b", "overlap on, graphs on (2nd run)"),
        ),
    ]
    return run


def print_table(results: dict[str, Any]) -> None:
    print("\n==== summary ====")
    env, jit = results.get("env") or {}, results.get("jit") or {}
    print(
        f"gpu {env.get('gpu')} flashinfer {env.get('flashinfer')} copy bw {env.get('copy_bandwidth_tbs')} TB/s; "
        f"jit {jit.get('wall_s')} s"
    )
    print_tput(results)
    if isinstance(results.get("fused_ops"), dict):
        print("fused_ops", {k: v for k, v in results["fused_ops"].items() if k != "section_seconds"})
    for name, r in results.items():
        if name.startswith("agreement_floor") and isinstance(r, dict):
            print(name, {k: v for k, v in r.items() if k not in ("engine", "traceback")})
    print_serve(results.get("serve") or {})
    for name in ("profile_decode", "profile_decode_qwen3_8b"):
        if results.get(name):
            print(name, pick(results[name], PROFILE_KEYS))
    print(f"total {results.get('total_seconds')} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="self-test on tiny shapes, torch backend")
    ap.add_argument("--budget", type=float, default=520.0, help="seconds after which sections are skipped")
    ap.add_argument("--only", default="", help="comma-separated section words to run (default: all)")
    ap.add_argument(
        "--tokenizer", default=None, help="the serve section's tokenizer (default: the embedded one)"
    )
    ap.add_argument("--serve-rates", type=rate_list, default=[8.0, 24.0, 64.0])
    ap.add_argument("--serve-prompts", type=int, default=400)
    ap.add_argument("--jit-skip", type=lambda v: v.split(","), default=[], help="jit modules not to compile")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    bench = Bench(cpu=args.cpu, budget_s=args.budget)
    for name, word, call in sections(bench, args):
        if not only or name == "env" or {word, name} & only:
            bench.section(name, call)
    bench.results["total_seconds"] = round(bench.elapsed(), 1)
    bench.save()
    print_table(bench.results)


if __name__ == "__main__":
    main()

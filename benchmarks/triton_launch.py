"""Host time per launch of the GPU fused ops: Skiff's Triton launcher against Triton's own path and FlashInfer.

Eager steps (prefill, mixed prefill + decode, every step with --cuda-graph-max-bs 0) launch these ops ~6
times per layer, and at decode sizes a kernel runs for a few microseconds, so the host's launch time sets
the step's pace. Per op at a decode shape (Qwen3-0.6B widths): microseconds per call over back-to-back
calls, through skiff.kernels.triton_ops with its cached handles ("direct"), the same wrappers through
Triton's JITFunction.run ("triton run"), and FlashInfer's ops (--flashinfer; JIT-compiled on first use).
First it checks that both Triton paths give bit-equal outputs on inputs that change every specialization
(1, 16 or 17 rows, odd row strides, pointers off 16-byte alignment); a difference exits 1.

    python3 benchmarks/triton_launch.py [--flashinfer] [--tokens 64]     # on a CUDA machine
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch
from gpu_fused_ops import HD, HIDDEN, HK, HQ, INTER

EPS = 1e-6


def _inputs(tokens: int, pad: int, seed: int, device: str = "cuda") -> dict[str, torch.Tensor]:
    """Fresh inputs from seed. pad > 0 offsets every row (odd row strides, pointers off 16-byte alignment)."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols + pad, device=device, generator=gen).to(torch.bfloat16)[:, pad:]

    qkv = rnd(tokens, (HQ + 2 * HK) * HD)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, HD, 2, device=device).float() / HD))
    table = torch.outer(torch.arange(4096, device=device).float(), inv_freq)
    return {
        "x": rnd(tokens, HIDDEN),
        "res": rnd(tokens, HIDDEN),
        "w": rnd(1, HIDDEN)[0],
        "wh": rnd(1, HD)[0],
        "q": qkv[:, : HQ * HD],
        "k": qkv[:, HQ * HD : (HQ + HK) * HD],
        "gate_up": rnd(tokens, 2 * INTER),
        "pos": torch.randint(0, 4096, (tokens,), device=device, generator=gen),
        "cos_sin": torch.cat([table.cos(), table.sin()], -1),
    }


def _calls(ops: Any, t: dict[str, torch.Tensor]) -> dict[str, Callable[[], Any]]:
    """Each op once on t; in-place ops return the tensors they wrote."""
    tokens = t["x"].shape[0]

    def add_rms_norm() -> tuple[torch.Tensor, ...]:
        ops.add_rms_norm_(t["x"], t["res"], t["w"], EPS)
        return t["x"], t["res"]

    def rope() -> tuple[torch.Tensor, ...]:
        ops.rope_(t["pos"], t["q"], t["k"], HD, t["cos_sin"])
        return t["q"], t["k"]

    return {
        "rms_norm": lambda: ops.rms_norm(t["x"], t["w"], EPS),
        "rms_norm_heads": lambda: ops.rms_norm(t["q"].view(tokens, HQ, HD), t["wh"], EPS),
        "add_rms_norm": add_rms_norm,
        "rope": rope,
        "silu_and_mul": lambda: ops.silu_and_mul(t["gate_up"]),
    }


class _NoCache(dict):
    def __setitem__(self, key: Any, value: Any) -> None:  # every call takes Triton's JITFunction.run
        pass


@contextmanager
def triton_run_path():
    from skiff.kernels import triton_ops
    from skiff.kernels.triton_launcher import Launcher

    launchers = [v for v in vars(triton_ops).values() if isinstance(v, Launcher)]
    saved = [lc.compiled for lc in launchers]
    for lc in launchers:
        lc.compiled = _NoCache()
    try:
        yield
    finally:
        for lc, cache in zip(launchers, saved, strict=True):
            lc.compiled = cache


def _outputs(ops: Any, name: str, tokens: int, pad: int) -> list[torch.Tensor]:
    out = _calls(ops, _inputs(tokens, pad, seed=tokens * 10 + pad))[name]()
    return [o.clone() for o in (out if isinstance(out, tuple) else (out,))]


def check_paths(ops: Any) -> list[str]:
    """Cases where the direct launch and Triton's own launch differ (none expected)."""
    bad = []
    for tokens in (1, 2, 15, 16, 17, 64, 255, 1000):
        for pad in (0, 1):
            for name in _calls(ops, _inputs(1, 0, 0)):
                with triton_run_path():
                    want = _outputs(ops, name, tokens, pad)
                _outputs(ops, name, tokens, pad)  # compiles and caches this specialization's handle
                got = _outputs(ops, name, tokens, pad)
                if any(not torch.equal(a, b) for a, b in zip(got, want, strict=True)):
                    bad.append(f"{name} tokens={tokens} pad={pad}")
    return bad


def per_call_us(fn: Callable[[], Any], n: int = 2000, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return round(statistics.median(times), 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flashinfer", action="store_true", help="also time FlashInfer's ops (JIT on first use)")
    ap.add_argument("--tokens", type=int, default=64, help="rows per call (a decode batch)")
    args = ap.parse_args()
    from skiff.layers import fused

    triton_ops = fused.GPU_PROVIDERS["triton"]()
    res: dict[str, Any] = {"mismatches": check_paths(triton_ops)}
    calls = _calls(triton_ops, _inputs(args.tokens, 0, seed=0))
    res["direct"] = {k: per_call_us(f) for k, f in calls.items()}
    with triton_run_path():
        res["triton run"] = {k: per_call_us(f) for k, f in calls.items()}
    if args.flashinfer:
        fi = fused.GPU_PROVIDERS["flashinfer"]()
        res["flashinfer"] = {
            k: per_call_us(f) for k, f in _calls(fi, _inputs(args.tokens, 0, seed=0)).items()
        }
    empty = _inputs(args.tokens, 0, seed=0)["x"]
    res["torch.empty"] = per_call_us(lambda: torch.empty(empty.shape, dtype=empty.dtype, device=empty.device))
    print(json.dumps(res))
    print(f"\nus per call, {args.tokens} tokens   " + "  ".join(f"{k:>14}" for k in calls))
    for path in ("direct", "triton run", "flashinfer"):
        if path in res:
            print(f"{path:26}" + "  ".join(f"{res[path][k]:>14}" for k in calls))
    print(f"torch.empty alone: {res['torch.empty']} us; path mismatches: {res['mismatches'] or 'none'}")
    sys.exit(1 if res["mismatches"] else 0)


if __name__ == "__main__":
    main()

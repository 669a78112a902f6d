"""The device the numbers come from, and FlashInfer's JIT paid before anything is timed.

env: GPU, versions, and the measured device-to-device copy bandwidth (the throughput floor's denominator).
jit: every FlashInfer module the runs use (attention at head dims 128 and 64, sampling) and both fused-op
providers, compiled in parallel threads (~100 s on a fresh machine, mostly waiting on the compiler).
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
from harness import Bench


def env_section(bench: Bench) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0]}
    if bench.cpu:
        return info
    import flashinfer

    info["gpu"] = torch.cuda.get_device_name()
    info["gpu_mem_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    info["flashinfer"] = flashinfer.__version__
    n = 2**30  # a 2 GiB bf16 buffer, copied device to device
    a = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    info["copy_bandwidth_tbs"] = round(2 * n * 2 / times[len(times) // 2] / 1e12, 3)  # read + write
    del a, b
    torch.cuda.empty_cache()
    return info


def _fused_op_jobs(dev: str, bf: torch.dtype) -> dict[str, Callable[[], None]]:
    from skiff.layers import fused

    providers = [p for p in (make() for make in fused.GPU_PROVIDERS.values()) if p is not None]

    def norms() -> None:
        x = torch.randn(8, 1024, dtype=bf, device=dev)
        w = torch.ones(1024, dtype=bf, device=dev)
        for ops in providers:
            ops.rms_norm(x, w, 1e-6)
            ops.rms_norm(x.view(8, 8, 128), w[:128], 1e-6)
            ops.add_rms_norm_(x.clone(), x.clone(), w, 1e-6)

    def rope() -> None:
        pos = torch.arange(8, device=dev)
        q = torch.randn(8, 16 * 128, dtype=bf, device=dev)
        k = torch.randn(8, 8 * 128, dtype=bf, device=dev)
        for ops in providers:
            ops.rope_(pos, q, k, 128, torch.randn(4096, 128, device=dev))
            ops.rope_(pos, q[:, : 32 * 64], k[:, : 8 * 64], 64, torch.randn(4096, 64, device=dev))

    def silu() -> None:
        for ops in providers:
            ops.silu_and_mul(torch.randn(8, 256, dtype=bf, device=dev))

    return {"norm": norms, "rope": rope, "silu": silu}


def _attention_job(head_dim: int, heads: int, dev: str, bf: torch.dtype) -> Callable[[], None]:
    def run() -> None:
        from skiff.attention.flashinfer_backend import FlashInferBackend
        from skiff.engine.forward_batch import ForwardBatch
        from skiff.kvcache.pool import KVPool

        pool = KVPool(1, 8, 16, 8, head_dim, bf, torch.device(dev))
        backend = FlashInferBackend(pool, heads, 8, head_dim)
        for q_lens, seq_lens, num_decode in (([1, 1], [5, 9], 2), ([1, 7], [5, 20], 1)):
            t = sum(q_lens)
            batch = ForwardBatch(
                input_ids=torch.zeros(t, dtype=torch.long, device=dev),
                positions=torch.zeros(t, dtype=torch.long, device=dev),
                out_slots=torch.arange(16, 16 + t, device=dev),
                q_lens=q_lens,
                seq_lens=seq_lens,
                page_tables=[[1, 2], [3, 4]],
                num_decode=num_decode,
                logit_rows=torch.arange(t, device=dev),
                page_size=16,
            )
            backend.prepare(batch)
            q = torch.randn(t, heads, head_dim, dtype=bf, device=dev)
            kv = torch.randn(t, 8, head_dim, dtype=bf, device=dev)
            backend.forward(q, kv, kv.clone(), 0)

    return run


def jit_section(bench: Bench, skip: list[str]) -> dict[str, Any]:
    import flashinfer

    dev, bf = "cuda", torch.bfloat16

    def sampling() -> None:
        probs = torch.softmax(torch.randn(4, 1000, device=dev), -1)
        ks = torch.full((4,), 50, dtype=torch.int32, device=dev)
        flashinfer.top_k_top_p_sampling_from_probs(probs, ks, torch.full((4,), 0.9, device=dev))

    jobs = _fused_op_jobs(dev, bf) | {
        "sampling": sampling,
        "attn_hd128": _attention_job(128, 16, dev, bf),
        "attn_hd64": _attention_job(64, 32, dev, bf),
    }
    times: dict[str, Any] = {}

    def timed(name: str, fn: Callable[[], None]) -> None:
        t0 = time.perf_counter()
        try:
            fn()
            torch.cuda.synchronize()
            times[name] = round(time.perf_counter() - t0, 1)
        except Exception as exc:
            times[name] = f"error: {exc!r}"
            bench.log(f"!! jit {name}: {traceback.format_exc()}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=timed, args=item) for item in jobs.items() if item[0] not in skip]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"per_module_s": times, "wall_s": round(time.perf_counter() - t0, 1)}

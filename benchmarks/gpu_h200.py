"""The GPU fast path on one H200: build, check and measure everything in one run.

Sections (each guarded; results land in $OUT/results.json as they come):
  env        GPU, versions, measured device-to-device copy bandwidth (the floor's denominator)
  jit        FlashInfer kernels compiled in parallel threads before anything is timed
  tput_*     the anchors' offline workload (256 seqs, prompts 100-1024, outputs 100-1024, T=0.6, page 256,
             prefill budget 16384, context 4096, graphs to bs 256) on the Qwen3-0.6B shape, random weights:
             overlap+graphs (twice), overlap off, graphs off; fraction of the memory floor
  check_*    Skiff (FlashInfer, CUDA graphs, overlap) vs HF transformers bf16 on the same weights: greedy
             next-token agreement under teacher forcing (20 prompts x 128 positions), prefill logits, NaN,
             overlap on/off identical, radix hit vs miss identical, page sizes 1/16/256; and the floor under
             that agreement: HF decode vs HF prefill, HF's SDPA backends, Skiff decode vs prefill (agreement_floor.py)
  fused_ops  the two GPU fused-op providers vs HF torch code: bit-equality and time (gpu_fused_ops.py)
  profile    where one decode step's time goes (torch profiler kernel categories, host phases)
  big        the Qwen3-8B shape on the same workload
A short table is printed last. `--cpu` runs every section on tiny shapes with the torch backend (a
self-test of this script on a machine without a GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import sys
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

OUT = Path(os.environ.get("OUT") or "/tmp/skiff_gpu_out")
RESULTS: dict[str, Any] = {}
T_START = time.perf_counter()

QWEN3_06B = dict(
    cls="Qwen3Config",
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1e6,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)
QWEN3_8B = dict(
    QWEN3_06B,
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    tie_word_embeddings=False,
)
LLAMA_1B = dict(
    cls="LlamaConfig",
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    max_position_embeddings=131072,
    rope_theta=500000.0,
    tie_word_embeddings=True,
    rms_norm_eps=1e-5,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=49152,
)  # >= the embedded tokenizer the serve section uses


def log(*args: Any) -> None:
    print(f"[{time.perf_counter() - T_START:7.1f}s]", *args, flush=True)


def save() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def section(name: str, budget_s: float | None = None):
    """Decorator-free guard: run fn, record its result or traceback, respect the overall time budget."""

    def run(fn, *args: Any, **kwargs: Any) -> Any:
        if budget_s is not None and time.perf_counter() - T_START > budget_s:
            RESULTS[name] = {"skipped": f"time budget {budget_s:.0f}s spent"}
            log(f"== {name}: skipped (budget)")
            save()
            return None
        log(f"== {name}")
        t0 = time.perf_counter()
        try:
            value = fn(*args, **kwargs)
            RESULTS[name] = value
        except Exception as exc:  # keep going: one broken section must not cost the rest of the run
            value = None
            RESULTS[name] = {"error": repr(exc), "traceback": traceback.format_exc()}
            log(f"!! {name} failed: {exc!r}\n{traceback.format_exc()}")
        if isinstance(RESULTS[name], dict):
            RESULTS[name]["section_seconds"] = round(time.perf_counter() - t0, 1)
        save()
        return value

    return run


# ---------------------------------------------------------------------------------------------- models
def hf_config(spec: dict[str, Any], tiny: bool):
    import transformers

    spec = dict(spec)
    cls = getattr(transformers, spec.pop("cls"))
    if tiny:
        spec.update(TINY)
        spec.pop("rope_scaling", None) if "Llama" not in cls.__name__ else None
    return cls(**spec)


def build_hf(spec: dict[str, Any], path: Path, args: argparse.Namespace, seed: int = 0):
    from transformers import AutoModelForCausalLM

    cfg = hf_config(spec, args.cpu)
    torch.manual_seed(seed)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(cfg)
    model.to(args.dtype).save_pretrained(path)
    del model
    # Reload rather than keep the cast model: `.to(bf16)` also rounds the rotary `inv_freq` buffer to bf16
    # (a phase error growing with position), which `from_pretrained(dtype=...)` keeps in fp32 as users get it.
    return AutoModelForCausalLM.from_pretrained(path, dtype=args.dtype).to(args.device).eval()


def random_checkpoint(spec: dict[str, Any], path: Path, args: argparse.Namespace):
    """config.json only; the runner's tensor iterator is swapped for random tensors made on the device."""
    from transformers import AutoModelForCausalLM

    cfg = hf_config(spec, args.cpu)
    path.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(path)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(cfg)
    shapes = [(n, tuple(t.shape)) for n, t in meta.state_dict().items()]
    gen = torch.Generator(device=args.device).manual_seed(0)

    def tensors(_path: Any, _raw: Any):
        for name, shape in shapes:
            if "norm" in name:
                yield name, torch.ones(shape, dtype=args.dtype, device=args.device)
            else:
                t = torch.empty(shape, dtype=args.dtype, device=args.device)
                yield name, t.normal_(0.0, 0.02, generator=gen)

    return tensors


def make_engine(path: Path, args: argparse.Namespace, **kw: Any):
    """Engine with fallbacks, so that one broken piece still leaves numbers for the rest."""
    from skiff.config import EngineConfig
    from skiff.engine.engine import Engine

    base = dict(
        model=str(path),
        device=args.device,
        dtype=str(args.dtype).removeprefix("torch."),
        attention_backend="torch" if args.cpu else "flashinfer",
        page_size=16,
        seed=0,
    )
    base.update(kw)
    free()  # the previous engine (held in reference cycles) must give its KV pool back first
    attempts = [
        base,
        dict(base, cuda_graph_max_bs=0),
        dict(base, cuda_graph_max_bs=0, attention_backend="torch"),
    ]
    errors = []
    for cfg_kw in attempts:
        try:
            engine = Engine(EngineConfig(**cfg_kw))
            if args.cpu and not cfg_kw.get("disable_overlap"):
                from skiff.engine.overlap import OverlapLoop

                engine.overlap = OverlapLoop(engine)  # the CPU self-test exercises the overlap loop too
            engine.fallback_errors = errors
            engine.actual_config = {k: v for k, v in cfg_kw.items() if k != "model"}
            return engine
        except Exception as exc:
            errors.append(
                f"{cfg_kw.get('attention_backend')}/graphs={cfg_kw.get('cuda_graph_max_bs', 256)}: {exc!r}"
            )
            log("!! engine build failed, falling back:", repr(exc), traceback.format_exc())
            free()
    raise RuntimeError(f"no engine could be built: {errors}")


def free(*objs: Any) -> None:
    for o in objs:
        if o is not None and hasattr(o, "shutdown"):
            o.shutdown()
    del objs
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def generate(engine: Any, prompts: list[list[int]], params: list[Any]) -> list[list[int]]:
    rids = []
    out: dict[str, list[int]] = {}
    base = getattr(engine, "_bench_counter", 0)
    engine._bench_counter = base + len(prompts)
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        rid = f"b{base + i}"
        engine.add_request(rid, p, sp)
        rids.append(rid)
        out[rid] = []
    while engine.has_work:
        for o in engine.step():
            if o.rid in out:
                out[o.rid].extend(o.token_ids)
    return [out[r] for r in rids]


# ---------------------------------------------------------------------------------------------- sections
def env_section(args: argparse.Namespace) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0]}
    if args.cpu:
        return info
    info["gpu"] = torch.cuda.get_device_name()
    info["gpu_mem_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    import flashinfer

    info["flashinfer"] = flashinfer.__version__
    n = 2**30  # 2 GiB bf16 buffer, copied device to device
    a = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    times.sort()
    info["copy_bandwidth_tbs"] = round(2 * n * 2 / times[len(times) // 2] / 1e12, 3)  # read + write
    del a, b
    torch.cuda.empty_cache()
    return info


def jit_section(args: argparse.Namespace) -> dict[str, Any]:
    """Compile every FlashInfer module (and both fused-op providers) the runs use, in parallel threads."""
    import flashinfer
    from skiff.attention.flashinfer_backend import FlashInferBackend
    from skiff.kvcache.pool import KVPool
    from skiff.layers import fused

    dev, bf = "cuda", torch.bfloat16
    times: dict[str, float] = {}

    def timed(name: str, fn: Any) -> None:
        t0 = time.perf_counter()
        try:
            fn()
            torch.cuda.synchronize()
            times[name] = round(time.perf_counter() - t0, 1)
        except Exception as exc:
            times[name] = f"error: {exc!r}"
            log(f"!! jit {name}: {traceback.format_exc()}")

    providers = [p for p in (fused.GPU_PROVIDERS[n]() for n in fused.GPU_PROVIDERS) if p is not None]

    def norms() -> None:
        x = torch.randn(8, 1024, dtype=bf, device=dev)
        w = torch.ones(1024, dtype=bf, device=dev)
        for ops in providers:
            ops.rms_norm(x, w, 1e-6)
            ops.rms_norm(x.view(8, 8, 128), w[:128], 1e-6)
            ops.add_rms_norm_(x.clone(), x.clone(), w, 1e-6)

    def rope() -> None:
        q = torch.randn(8, 16 * 128, dtype=bf, device=dev)
        k = torch.randn(8, 8 * 128, dtype=bf, device=dev)
        cs = torch.randn(4096, 128, dtype=torch.float32, device=dev)
        cs64 = torch.randn(4096, 64, dtype=torch.float32, device=dev)
        for ops in providers:
            ops.rope_(torch.arange(8, device=dev), q, k, 128, cs)
            ops.rope_(
                torch.arange(8, device=dev), q.view(8, -1)[:, : 32 * 64], k.view(8, -1)[:, : 8 * 64], 64, cs64
            )

    def act() -> None:
        for ops in providers:
            ops.silu_and_mul(torch.randn(8, 256, dtype=bf, device=dev))

    def sampling() -> None:
        probs = torch.softmax(torch.randn(4, 1000, device=dev), -1)
        flashinfer.top_k_top_p_sampling_from_probs(
            probs, torch.full((4,), 50, dtype=torch.int32, device=dev), torch.full((4,), 0.9, device=dev)
        )

    def attention(head_dim: int, heads: int) -> Any:
        def fn() -> None:
            from skiff.engine.forward_batch import ForwardBatch

            pool = KVPool(1, 8, 16, 8, head_dim, bf, torch.device(dev))
            be = FlashInferBackend(pool, heads, 8, head_dim)
            for q_lens, seq_lens, nd in (([1, 1], [5, 9], 2), ([1, 7], [5, 20], 1)):
                t = sum(q_lens)
                slots = torch.arange(16, 16 + t, device=dev)
                fb = ForwardBatch(
                    torch.zeros(t, dtype=torch.long, device=dev),
                    torch.zeros(t, dtype=torch.long, device=dev),
                    slots,
                    q_lens,
                    seq_lens,
                    [[1, 2], [3, 4]],
                    nd,
                    torch.arange(t, device=dev),
                    16,
                )
                be.prepare(fb)
                be.forward(
                    torch.randn(t, heads, head_dim, dtype=bf, device=dev),
                    torch.randn(t, 8, head_dim, dtype=bf, device=dev),
                    torch.randn(t, 8, head_dim, dtype=bf, device=dev),
                    0,
                )

        return fn

    jobs = {
        "norm": norms,
        "rope": rope,
        "silu": act,
        "sampling": sampling,
        "attn_hd128": attention(128, 16),
        "attn_hd64": attention(64, 32),
    }
    jobs = {k: v for k, v in jobs.items() if k not in args.jit_skip}
    t0 = time.perf_counter()
    threads = [threading.Thread(target=timed, args=(n, f)) for n, f in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"per_module_s": times, "wall_s": round(time.perf_counter() - t0, 1)}


def workload(args: argparse.Namespace):
    from skiff.bench.offline import OfflineWorkload
    from skiff.params import SamplingParams

    wl = OfflineWorkload()
    if args.cpu:
        wl = OfflineWorkload(
            num_seqs=8, min_input_len=10, max_input_len=60, min_output_len=5, max_output_len=30
        )
    prompts, outs = wl.build()
    params = [SamplingParams(max_tokens=n, temperature=wl.temperature, ignore_eos=True) for n in outs]
    return prompts, outs, params


def floor_seconds(
    spec: dict[str, Any],
    prompts: list[list[int]],
    outs: list[int],
    bandwidth: float,
    args: argparse.Namespace,
) -> dict[str, float]:
    """Bytes a perfect engine must read: each decode step's KV of every live sequence, plus the weights once
    per step (all 256 sequences fit in the pool at once, so the step count is the longest output)."""
    cfg = hf_config(spec, args.cpu)
    layers, kv_heads, head_dim = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    per_token = 2 * layers * kv_heads * head_dim * 2
    kv = sum(per_token * (len(p) * n + n * (n - 1) // 2) for p, n in zip(prompts, outs, strict=True))
    h, inter, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    q, kvw = cfg.num_attention_heads * head_dim, kv_heads * head_dim
    per_layer = h * (q + 2 * kvw) + q * h + 3 * h * inter
    weights = 2 * (
        layers * per_layer + v * h
    )  # lm head read every step; the embedding rows read are negligible
    steps = max(outs)
    total = kv + weights * steps
    return {
        "kv_bytes_tb": round(kv / 1e12, 2),
        "weight_bytes_gb": round(weights / 1e9, 2),
        "decode_steps": steps,
        "floor_s": round(total / (bandwidth * 1e12), 2),
    }


def tput_section(
    path: Path, args: argparse.Namespace, spec: dict[str, Any], label: str, **kw: Any
) -> dict[str, Any]:
    prompts, outs, params = workload(args)
    t0 = time.perf_counter()
    cfg_kw = dict(
        page_size=256,
        chunked_prefill_size=16384,
        context_length=4096,
        cuda_graph_max_bs=256 if not args.cpu else 0,
        max_running_requests=256,
    )
    cfg_kw.update(kw)
    engine = make_engine(path, args, **cfg_kw)
    load_s = time.perf_counter() - t0
    try:
        from skiff.params import SamplingParams

        generate(engine, prompts[:4], [SamplingParams(max_tokens=8, temperature=0.6, ignore_eos=True)] * 4)
        if not args.cpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        results = generate(engine, prompts, params)
        wall = time.perf_counter() - t0
        st = engine.stats()
        engine.check_integrity()
        graphs = engine.runner.graphs
        res = {
            "label": label,
            "config": engine.actual_config,
            "fallbacks": engine.fallback_errors,
            "wall_s": round(wall, 3),
            "output_tokens": sum(map(len, results)),
            "expected_tokens": sum(outs),
            "output_tok_s": round(sum(map(len, results)) / wall, 1),
            "load_s": round(load_s, 1),
            "graph_capture_s": round(graphs.capture_seconds, 1) if graphs is not None else None,
            "kv_pool_tokens": (engine.runner.num_pages - 1) * engine.cfg.page_size,
            "preemptions": st.num_preemptions,
            "overlap": engine.overlap is not None,
        }
        bw = (RESULTS.get("env") or {}).get("copy_bandwidth_tbs") or 4.3
        fl = floor_seconds(spec, prompts, outs, bw, args)
        res["floor"] = fl
        res["fraction_of_floor"] = round(fl["floor_s"] / wall, 3)
        log(f"   {label}: {res['output_tok_s']} tok/s in {wall:.2f}s (floor {fl['floor_s']}s)")
        return res
    finally:
        free(engine)


def check_section(
    path: Path,
    hf: Any,
    args: argparse.Namespace,
    n_prompts: int = 20,
    n_new: int = 128,
    quick: bool = False,
    prompts: list[list[int]] | None = None,
    fp32_ref: bool = True,
) -> dict[str, Any]:
    """quick: only the default engine (page 16, overlap, graphs) and its radix-hit pass, no fp32 reference.
    prompts: token ids to use instead of 20 random-id prompts (the real model's chat prompts).
    fp32_ref: also compare against HF in fp32 (not for GGUF-loaded HF models, which refuse .float())."""
    from skiff.params import SamplingParams

    rng = random.Random(7)
    vocab = hf.config.vocab_size
    if args.cpu:
        n_prompts, n_new = 6, 12
    if prompts is None:
        prompts = [
            [
                rng.randint(0, min(vocab, 10000) - 1)
                for _ in range(rng.randint(32, 400 if not args.cpu else 40))
            ]
            for _ in range(n_prompts)
        ]
    n_prompts = len(prompts)
    greedy = [SamplingParams(max_tokens=n_new, temperature=0.0, ignore_eos=True) for _ in prompts]
    res: dict[str, Any] = {}
    runs: dict[str, list[list[int]]] = {}
    prefill: list[torch.Tensor] = []
    skiff_tf: list[torch.Tensor] = []
    variants = (
        ("ps16_overlap", {}),
        ("ps16_no_overlap", {"disable_overlap": True}),
        ("ps1", {"page_size": 1}),
        ("ps256", {"page_size": 256}),
    )
    for name, kw in variants[:1] if quick else variants:
        engine = make_engine(path, args, max_total_tokens=200_000, context_length=4096, **kw)
        try:
            runs[name] = generate(engine, prompts, greedy)
            res[f"{name}_config"] = engine.actual_config
            if engine.fallback_errors:
                res[f"{name}_fallbacks"] = engine.fallback_errors
            if name == "ps16_overlap":
                hits0 = engine.cache_hit_tokens
                again = generate(engine, prompts, greedy)  # every prompt now hits the radix cache
                runs["radix_hit"] = again
                res["radix_hit_tokens"] = engine.cache_hit_tokens - hits0
                res["radix_hit_vs_miss_identical"] = sum(
                    a == b for a, b in zip(again, runs[name], strict=True)
                )
                prefill = [engine.prefill_logits(p).float().cpu() for p in prompts[:4]]
                if not quick:  # Skiff's prefill over its own greedy tokens: its decode-vs-prefill floor
                    skiff_tf = [
                        engine.prefill_logits(p + o)[len(p) - 1 : len(p) - 1 + len(o)].float()
                        for p, o in zip(prompts, runs[name], strict=True)
                    ]
            engine.check_integrity()
        finally:
            free(engine)
            del engine
    base = runs["ps16_overlap"]
    res["prompts"] = n_prompts
    res["positions"] = n_prompts * n_new
    if not quick:
        res["overlap_on_off_identical"] = sum(
            a == b for a, b in zip(base, runs["ps16_no_overlap"], strict=True)
        )
        for ps in ("ps1", "ps256"):
            res[f"{ps}_identical_to_ps16"] = sum(a == b for a, b in zip(base, runs[ps], strict=True))
    # HF teacher forcing over Skiff's own greedy trajectories, in bf16 (the bar) and fp32 (the noise level)
    nan = False

    def hf_preds(trajectories: list[list[int]]) -> list[torch.Tensor]:
        nonlocal nan
        preds = []
        with torch.no_grad():
            for p, o in zip(prompts, trajectories, strict=True):
                logits = hf(input_ids=torch.tensor([p + o], device=args.device)).logits[0].float()
                nan |= bool(torch.isnan(logits).any())
                preds.append(logits[len(p) - 1 : len(p) - 1 + len(o)])
        return preds

    def agreement(trajectories: list[list[int]], preds: list[torch.Tensor]) -> tuple[float, float, float]:
        """Strict; counting exact ties (HF's bf16 logits give Skiff's token the max too: HF's own pick among
        equal logits is just the lowest id); counting near-ties (HF gap <= 1 % of the max logit)."""
        agree = exact = ties = total = 0
        for o, pred in zip(trajectories, preds, strict=True):
            ref = pred.argmax(-1)
            mine = torch.tensor(o, device=pred.device)
            same = ref == mine
            gap = pred.gather(1, ref[:, None])[:, 0] - pred.gather(1, mine[:, None])[:, 0]
            agree += int(same.sum())
            exact += int(((~same) & (gap == 0)).sum())
            ties += int(((~same) & (gap <= 1e-2 * pred.abs().amax(-1))).sum())
            total += len(o)
        return round(agree / total, 4), round((agree + exact) / total, 4), round((agree + ties) / total, 4)

    def prefill_ref() -> list[torch.Tensor]:
        with torch.no_grad():
            return [
                hf(input_ids=torch.tensor([p], device=args.device)).logits[0].float().cpu()
                for p in prompts[:4]
            ]

    def rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[float, float]:
        errs = [float((x - y).norm() / y.norm()) for x, y in zip(a, b, strict=True)]
        arg = sum(int((x.argmax(-1) == y.argmax(-1)).sum()) for x, y in zip(a, b, strict=True))
        return round(max(errs), 5), round(arg / sum(len(y) for y in b), 4)

    preds16 = hf_preds(base)
    (
        res["teacher_forced_agreement"],
        res["teacher_forced_agreement_with_exact_ties"],
        res["teacher_forced_agreement_with_near_ties"],
    ) = agreement(base, preds16)
    res["radix_hit_teacher_forced_agreement"] = agreement(runs["radix_hit"], hf_preds(runs["radix_hit"]))[0]
    if hasattr(hf, "set_attn_implementation") and not args.cpu:
        # HF against itself with another attention kernel: how far a kernel change alone moves the argmaxes
        hf.set_attn_implementation("eager")
        eager = hf_preds(base)
        hf.set_attn_implementation("sdpa")
        res["hf_eager_vs_hf_sdpa_agreement"] = agreement([p.argmax(-1).tolist() for p in eager], preds16)[0]
    if not quick:
        from agreement_floor import floor_section

        res["floor"] = floor_section(
            hf, prompts, n_new, args.device, base, skiff_tf, hf_preds, preds16, agreement
        )
    ref16 = prefill_ref()
    res["prefill_logits_rel_err_max"], res["prefill_argmax_agreement"] = rel(prefill, ref16)
    nan |= any(bool(torch.isnan(x).any()) for x in prefill)
    if (
        not args.cpu and not quick and fp32_ref
    ):  # the same against HF in fp32: how much of the gap is bf16 itself
        # (last: .float() leaves hf in fp32, and casting back would round its rotary inv_freq buffer)
        hf.float()
        preds32 = hf_preds(base)
        res["fp32_ref_skiff_agreement"] = agreement(base, preds32)[0]
        hf16_tokens = [p.argmax(-1).tolist() for p in preds16]
        res["fp32_ref_hf_bf16_agreement"] = agreement(hf16_tokens, preds32)[0]
        ref32 = prefill_ref()
        res["fp32_ref_prefill_rel_err_skiff"], res["fp32_ref_prefill_argmax_skiff"] = rel(prefill, ref32)
        res["fp32_ref_prefill_rel_err_hf_bf16"], res["fp32_ref_prefill_argmax_hf_bf16"] = rel(ref16, ref32)
    res["nan"] = nan
    log("  ", {k: v for k, v in res.items() if not k.endswith("config")})
    return res


@contextlib.contextmanager
def fused_ops_provider(name: str) -> Iterator[None]:
    """Engines built inside use the GPU fused ops of `name` (SKIFF_FUSED_OPS); the default comes back after."""
    from skiff.layers import fused

    os.environ["SKIFF_FUSED_OPS"] = name
    fused.gpu_ops.cache_clear()
    try:
        yield
    finally:
        os.environ.pop("SKIFF_FUSED_OPS")
        fused.gpu_ops.cache_clear()


def smollm_check(args: argparse.Namespace) -> dict[str, Any]:
    """The check on trained weights (SmolLM2-135M-Instruct, Llama architecture, dequantized Q4_1) with chat
    prompts, for both fused-op providers; HF loads the same GGUF file."""
    from skiff.layers import fused
    from transformers import AutoModelForCausalLM

    gguf = Path(args.smollm_gguf)
    prompts = json.loads(Path(args.smollm_prompts).read_text())
    out: dict[str, Any] = {}
    for provider in fused.GPU_PROVIDERS:
        hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=args.dtype)
        with fused_ops_provider(provider):
            out[provider] = check_section(
                gguf,
                hf.to(args.device).eval(),
                args,
                prompts=prompts,
                quick=provider != "triton",
                fp32_ref=False,
            )  # HF: no .float() on GGUF
        del hf
        free()
    return out


def sampling_section(args: argparse.Namespace) -> dict[str, Any]:
    """The device sampler draws from the right distribution: 51,200 draws against the exact probabilities."""
    from skiff.engine.sampler import _filter, sample_device
    from skiff.params import SamplingParams

    vocab, rows = 151936 if not args.cpu else 1000, 256
    gen = torch.Generator(device=args.device).manual_seed(1)
    base = torch.randn(vocab, device=args.device, generator=gen) * 0.5
    base[:10] += torch.linspace(
        12, 10, 10, device=args.device
    )  # most mass on ten tokens, the rest in the tail
    logits = base.expand(rows, vocab).contiguous()
    out: dict[str, Any] = {}
    for name, sp in (
        ("temperature_0.7", SamplingParams(temperature=0.7)),
        ("top_k_20_top_p_0.9", SamplingParams(temperature=0.7, top_k=20, top_p=0.9)),
    ):
        counts = torch.zeros(vocab, device=args.device)
        for _ in range(200 if not args.cpu else 5):
            toks = sample_device(logits.clone(), [sp] * rows, [None] * rows, [[]] * rows, [[]] * rows).tokens
            counts += torch.bincount(toks, minlength=vocab).float()
        emp = counts / counts.sum()
        ref = _filter(base[None].clone(), [sp])[0]
        out[name] = {
            "draws": int(counts.sum()),
            "tv_distance": round(float(0.5 * (emp - ref).abs().sum()), 4),
            "max_abs_diff": round(float((emp - ref).abs().max()), 4),
            "outside_support": int(counts[ref == 0].sum()),
        }
    log("  ", out)
    return out


def diag_section(spec: dict[str, Any], path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Prefill-logit error against HF fp32 for each combination of attention backend and fused ops."""
    from skiff.layers import fused

    hf = build_hf(spec, path, args)
    rng = random.Random(7)
    prompts = [
        [rng.randint(0, 9999) for _ in range(rng.randint(32, 400 if not args.cpu else 40))] for _ in range(4)
    ]
    with torch.no_grad():
        ref16 = [hf(input_ids=torch.tensor([p], device=args.device)).logits[0].float() for p in prompts]
        hf.float()
        ref32 = [hf(input_ids=torch.tensor([p], device=args.device)).logits[0].float() for p in prompts]
    del hf
    free()

    def err(a: list[torch.Tensor]) -> float:
        return round(
            max(float((x.to(y.device) - y).norm() / y.norm()) for x, y in zip(a, ref32, strict=True)), 5
        )

    out: dict[str, Any] = {"hf_bf16": err(ref16)}
    for backend in ["flashinfer", "torch"] if not args.cpu else ["torch"]:
        for fused_on in (True, False):
            os.environ["SKIFF_DISABLE_FUSED_OPS"] = "0" if fused_on else "1"
            fused._flashinfer.cache_clear()
            fused.gpu_ops.cache_clear()
            engine = make_engine(
                path, args, attention_backend=backend, cuda_graph_max_bs=0, max_total_tokens=50_000
            )
            try:
                out[f"{backend}_fused={fused_on}"] = err([engine.prefill_logits(p).float() for p in prompts])
            finally:
                free(engine)
                del engine
    os.environ["SKIFF_DISABLE_FUSED_OPS"] = "0"
    fused._flashinfer.cache_clear()
    fused.gpu_ops.cache_clear()
    log("  ", out)
    return out


def profile_section(
    path: Path, args: argparse.Namespace, trace: str = "decode_profile_trace.json"
) -> dict[str, Any]:
    """Steady-state decode at bs 256 (~600-token contexts): kernel time by category and host phases per step;
    also the wall time of the prefill phase before it (256 prompts, chunked)."""
    from skiff.params import SamplingParams

    rng = random.Random(3)
    n = 256 if not args.cpu else 8
    prompts = [
        [rng.randint(0, 9999) for _ in range(rng.randint(400, 800) if not args.cpu else 20)] for _ in range(n)
    ]
    params = [SamplingParams(max_tokens=80 if not args.cpu else 12, temperature=0.6, ignore_eos=True)] * n
    engine = make_engine(
        path,
        args,
        page_size=256,
        chunked_prefill_size=16384,
        context_length=4096,
        cuda_graph_max_bs=256 if not args.cpu else 0,
    )
    host: dict[str, list[float]] = defaultdict(list)

    def timed(obj: Any, attr: str, key: str) -> None:
        fn = getattr(obj, attr)

        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                host[key].append(time.perf_counter() - t0)

        setattr(obj, attr, wrapper)

    try:
        generate(engine, prompts[:4], [SamplingParams(max_tokens=4, temperature=0.6, ignore_eos=True)] * 4)
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
            engine.add_request(f"prof{i}", p, sp)
        if not args.cpu:
            torch.cuda.synchronize()
        t_prefill, prefill_steps = time.perf_counter(), 0
        while (
            any(r.remaining > 1 or not r.output_ids for r in engine.scheduler.running)
            or engine.scheduler.waiting
        ):
            engine.step()  # prefill everything first
            prefill_steps += 1
        if not args.cpu:
            torch.cuda.synchronize()
        prefill_wall = time.perf_counter() - t_prefill
        for _ in range(5):
            engine.step()
        timed(engine.scheduler, "schedule", "schedule")
        if engine.overlap is not None:
            timed(engine.overlap, "_launch", "launch (plan + enqueue forward + sample)")
            timed(engine.overlap, "_process", "process (wait for tokens + bookkeeping)")
        timed(engine.runner, "forward", "runner.forward (enqueue)")
        steps = 30
        prof = None
        if not args.cpu:
            from torch.profiler import ProfilerActivity, profile

            prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            torch.cuda.synchronize()
            prof.__enter__()
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        if not args.cpu:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        res: dict[str, Any] = {
            "prefill_phase": {
                "prompt_tokens": sum(map(len, prompts)),
                "steps": prefill_steps,
                "wall_s": round(prefill_wall, 3),
                "tok_s": round(sum(map(len, prompts)) / prefill_wall),
            },
            "batch": len(engine.scheduler.running),
            "steps": steps,
            "wall_ms_per_step": round(wall / steps * 1e3, 3),
            "host_ms_per_step": {k: round(sum(v) / steps * 1e3, 3) for k, v in host.items()},
        }
        if prof is not None:
            prof.__exit__(None, None, None)
            cats: dict[str, float] = defaultdict(float)
            top = []
            for ev in prof.key_averages():
                dev_us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
                if not dev_us or ev.key.startswith(("cuda", "aten::", "ProfilerStep")) or ev.key in host:
                    continue
                k = ev.key.lower()
                cat = (
                    "attention"
                    if any(s in k for s in ("prefill", "decode", "attention", "mha", "batchprefill"))
                    else "gemm"
                    if any(s in k for s in ("gemm", "cutlass", "sm90", "nvjet", "xmma", "cublas", "matmul"))
                    else "norm"
                    if "norm" in k
                    else "rope"
                    if "rope" in k or "rotary" in k
                    else "silu_and_mul"
                    if "act_and_mul" in k or "silu" in k
                    else "kv_write (index_copy)"
                    if "index" in k and "copy" in k
                    else "sampling (softmax/argmax/exp)"
                    if any(s in k for s in ("softmax", "argmax", "exponential", "reduce", "max"))
                    else "copy/memset"
                    if any(s in k for s in ("memcpy", "memset", "copy"))
                    else "other"
                )
                cats[cat] += dev_us / 1e3 / steps
                top.append((dev_us / 1e3 / steps, ev.key[:90]))
            top.sort(reverse=True)
            res["gpu_ms_per_step_by_category"] = {
                k: round(v, 3) for k, v in sorted(cats.items(), key=lambda x: -x[1])
            }
            res["gpu_ms_per_step_total"] = round(sum(cats.values()), 3)
            res["top_kernels_ms_per_step"] = [(round(t, 3), k) for t, k in top[:15]]
            prof.export_chrome_trace(str(OUT / trace))
        while engine.has_work:
            engine.step()
        return res
    finally:
        free(engine)


def serve_section(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """`skiff serve` on the Qwen3-0.6B shape (vocabulary cut to the tokenizer's), driven by `skiff bench serve` at
    several Poisson request rates."""
    import socket
    import subprocess

    import httpx
    from skiff.tokenizer import load_tokenizer

    if args.cpu and not args.tokenizer:  # the self-test's random model ships no usable tokenizer
        from skiff.embedded import embedded_model_path

        args.tokenizer = str(embedded_model_path())
    tok = args.tokenizer or str(path)
    if (
        args.tokenizer
    ):  # the served model's vocabulary must be the tokenizer's, or most output ids decode to ""
        path = path.with_name(path.name + "_tokenizer_vocab")
        vocab = len(load_tokenizer(args.tokenizer))
        del_model = build_hf(
            dict(QWEN3_06B if not args.cpu else {"cls": "Qwen3Config"}, vocab_size=vocab), path, args
        )
        del del_model
        free()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log_file = open(OUT / "serve_server.log", "w")  # noqa: SIM115 (the server outlives this statement)
    cmd = [
        sys.executable,
        "-m",
        "skiff.cli",
        "serve",
        "--model",
        str(path),
        "--tokenizer",
        tok,
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--context-length",
        "4096",
    ]
    if args.cpu:
        cmd += ["--device", "cpu", "--max-total-tokens", "20000"]
    server = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {"command": " ".join(cmd[1:]), "runs": {}}
    try:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 300:
            if server.poll() is not None:
                raise RuntimeError(f"skiff serve exited with {server.returncode}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            raise RuntimeError("skiff serve did not become healthy in 300 s")
        out["startup_s"] = round(time.perf_counter() - t0, 1)
        rates = args.serve_rates if not args.cpu else [2.0]
        n = args.serve_prompts if not args.cpu else 6
        for rate in rates:
            res = OUT / f"serve_rate_{rate:g}.json"
            bench = [
                sys.executable,
                "-m",
                "skiff.cli",
                "bench",
                "serve",
                "--base-url",
                url + "/v1",
                "--tokenizer",
                tok,
                "--prompt-ids",
                "--num-prompts",
                str(n),
                "--random-input-len",
                "1024" if not args.cpu else "32",
                "--random-output-len",
                "256" if not args.cpu else "8",
                "--random-range-ratio",
                "0.25",
                "--request-rate",
                str(rate),
                "--no-progress",
                "--output-json",
                str(res),
                "--warmup-requests",
                "4",
            ]
            done = subprocess.run(bench, capture_output=True, text=True, timeout=240, env=env)
            log(done.stdout[-1500:], done.stderr[-800:])
            if done.returncode != 0 or not res.is_file():
                out["runs"][str(rate)] = {"error": f"rc={done.returncode}", "stderr": done.stderr[-800:]}
                continue
            summ = json.loads(res.read_text())["summary"]
            out["runs"][str(rate)] = {
                k: summ.get(k)
                for k in (
                    "completed",
                    "failed",
                    "duration_s",
                    "request_throughput",
                    "output_throughput",
                    "input_throughput",
                    "ttft_ms",
                    "tpot_ms",
                    "itl_ms",
                    "e2e_ms",
                )
            }
        metrics = httpx.get(url + "/metrics", timeout=10).text
        out["metrics_tail"] = [
            line
            for line in metrics.splitlines()
            if line.startswith(("sglang:num_running", "sglang:cache_hit", "sglang:token_usage"))
        ]
        return out
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        out["server_exit"] = server.returncode
        log_file.close()


# ---------------------------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true", help="self-test on tiny shapes, torch backend")
    ap.add_argument(
        "--budget", type=float, default=520.0, help="seconds after which remaining sections are skipped"
    )
    ap.add_argument("--only", default="", help="comma-separated section names to run (default: all)")
    ap.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer directory for the serve section (the embedded "
        "model's, saved by skiff; the random-weight models have none)",
    )
    ap.add_argument(
        "--serve-rates", type=lambda v: [float(x) for x in v.split(",")], default=[8.0, 24.0, 64.0]
    )
    ap.add_argument("--serve-prompts", type=int, default=400)
    ap.add_argument(
        "--jit-skip", type=lambda v: v.split(","), default=[], help="jit modules not to compile ahead"
    )
    ap.add_argument(
        "--smollm-gguf", default=None, help="SmolLM2-135M-Instruct GGUF file: the real-weight check"
    )
    ap.add_argument(
        "--smollm-prompts", default=None, help="JSON list of chat prompt token ids for that check"
    )
    args = ap.parse_args()
    args.device = "cpu" if args.cpu else "cuda"
    args.dtype = torch.float32 if args.cpu else torch.bfloat16
    only = set(filter(None, args.only.split(",")))

    def want(name: str) -> bool:
        return not only or name in only

    OUT.mkdir(parents=True, exist_ok=True)
    models = Path(os.environ.get("SKIFF_BENCH_MODELS", "/tmp/skiff_bench_models"))
    budget = args.budget

    section("env")(env_section, args)
    if not args.cpu and want("jit"):
        section("jit")(jit_section, args)
    if not args.cpu and want("fused_ops"):
        from gpu_fused_ops import fused_ops_section

        section("fused_ops")(fused_ops_section)
    if want("diag_llama"):
        section("diag_llama", budget)(diag_section, LLAMA_1B, models / "llama_diag", args)
    if want("diag_qwen3"):
        section("diag_qwen3", budget)(diag_section, QWEN3_06B, models / "qwen3_diag", args)
    if only and not only - {"env", "jit", "diag_llama", "diag_qwen3"}:
        save()
        print(json.dumps({k: v for k, v in RESULTS.items() if k.startswith("diag")}, indent=1))
        return
    qwen_path = models / "qwen3_0_6b_shape"
    qwen_hf = section("build_qwen3_0_6b")(build_hf, QWEN3_06B, qwen_path, args)
    if qwen_hf is None:
        raise SystemExit("cannot build the Qwen3-0.6B-shape model")
    if not args.cpu:
        qwen_hf.cpu()
    tputs = (
        ("tput_overlap_graphs", "overlap on, graphs on", {}),
        ("tput_no_overlap", "overlap off, graphs on", {"disable_overlap": True}),
        ("tput_no_graphs", "overlap on, graphs off", {"cuda_graph_max_bs": 0}),
    )
    for name, label, kw in tputs:
        if want(name):
            section(name, budget)(tput_section, qwen_path, args, QWEN3_06B, label, **kw)
    if want("check_sampling"):
        section("check_sampling", budget)(sampling_section, args)
    if want("check_qwen3"):
        qwen_hf.to(args.device)
        section("check_qwen3_0_6b", budget)(check_section, qwen_path, qwen_hf, args)
    del qwen_hf
    free()
    if want("check_llama"):
        llama_path = models / "llama_3_2_1b_shape"
        llama_hf = section("build_llama_1b", budget)(build_hf, LLAMA_1B, llama_path, args)
        if llama_hf is not None and want("check_llama_flashinfer_ops"):  # the other provider, same model
            with fused_ops_provider("flashinfer"):
                section("check_llama_3_2_1b_flashinfer_ops", budget)(
                    check_section, llama_path, llama_hf, args, quick=True
                )
        if llama_hf is not None:
            section("check_llama_3_2_1b", budget)(check_section, llama_path, llama_hf, args)
        del llama_hf
        free()
    if want("check_llama_fp16"):  # same check in fp16: 3 more mantissa bits show what bf16 rounding hides
        bf16, args.dtype = args.dtype, (torch.float16 if not args.cpu else args.dtype)
        try:
            llama_path = models / "llama_3_2_1b_shape_fp16"
            llama_hf = section("build_llama_1b_fp16", budget)(build_hf, LLAMA_1B, llama_path, args)
            if llama_hf is not None:
                section("check_llama_3_2_1b_fp16", budget)(check_section, llama_path, llama_hf, args)
            del llama_hf
            free()
        finally:
            args.dtype = bf16
    if args.smollm_gguf and want("check_smollm2"):  # the real model: trained weights, chat prompts
        section("check_smollm2_135m", budget)(smollm_check, args)
    if want("serve"):
        section("serve", budget)(serve_section, qwen_path, args)
    if want("profile"):
        section("profile_decode", budget)(profile_section, qwen_path, args)
    if want("big"):
        import skiff.engine.model_runner as mr

        big_path = models / "qwen3_8b_shape"
        tensors = section("build_qwen3_8b", budget)(random_checkpoint, QWEN3_8B, big_path, args)
        RESULTS["build_qwen3_8b"] = (
            "random tensors generated on the device" if tensors is not None else RESULTS["build_qwen3_8b"]
        )
        if tensors is not None:
            original = mr.iter_tensors
            mr.iter_tensors = tensors
            try:
                if want("profile_8b"):  # before the throughput runs: the table comes before any change
                    section("profile_decode_qwen3_8b", budget)(
                        profile_section, big_path, args, "decode_profile_trace_8b.json"
                    )
                section("tput_qwen3_8b", budget)(
                    tput_section, big_path, args, QWEN3_8B, "Qwen3-8B shape, overlap+graphs"
                )
                section("tput_qwen3_8b_no_overlap", budget - 60)(
                    tput_section,
                    big_path,
                    args,
                    QWEN3_8B,
                    "Qwen3-8B shape, overlap off",
                    disable_overlap=True,
                )
            finally:
                mr.iter_tensors = original
    if want("tput_overlap_graphs_run2"):
        section("tput_overlap_graphs_run2", budget)(
            tput_section, qwen_path, args, QWEN3_06B, "overlap on, graphs on (2nd run)"
        )
    RESULTS["total_seconds"] = round(time.perf_counter() - T_START, 1)
    save()
    print_table()


def print_table() -> None:
    print("\n==== summary ====")
    env = RESULTS.get("env") or {}
    print(
        f"gpu {env.get('gpu')} flashinfer {env.get('flashinfer')} copy bw {env.get('copy_bandwidth_tbs')} TB/s; "
        f"jit {(RESULTS.get('jit') or {}).get('wall_s')} s"
    )
    print(f"{'run':34} {'tok/s':>9} {'wall s':>7} {'floor%':>7} {'load s':>7} {'tokens':>8}")
    for k, v in RESULTS.items():
        if k.startswith("tput") and isinstance(v, dict):
            if "error" in v or "skipped" in v:
                print(f"{k:34} {v.get('error') or v.get('skipped')}"[:160])
                continue
            fallback = f"FALLBACK {v['fallbacks']}" if v["fallbacks"] else ""
            line = (
                f"{v['label'][:34]:34} {v['output_tok_s']:>9} {v['wall_s']:>7} "
                f"{100 * v['fraction_of_floor']:>6.1f}% {v['load_s']:>7} {v['output_tokens']:>8} {fallback}"
            )
            print(line[:220])
    on, off = RESULTS.get("tput_overlap_graphs") or {}, RESULTS.get("tput_no_overlap") or {}
    if "output_tok_s" in on and "output_tok_s" in off:
        print(f"overlap gain {on['output_tok_s'] / off['output_tok_s']:.3f}x")
    if isinstance(RESULTS.get("fused_ops"), dict):
        print("fused_ops", {k: v for k, v in RESULTS["fused_ops"].items() if k != "section_seconds"})
    for k, v in RESULTS.items():
        if k == "check_sampling":
            print(k, v)
        elif k == "check_smollm2_135m" and isinstance(v, dict):
            for prov, r in v.items():
                if isinstance(r, dict):
                    print(
                        k,
                        prov,
                        {
                            x: r.get(x)
                            for x in (
                                "teacher_forced_agreement",
                                "teacher_forced_agreement_with_exact_ties",
                                "teacher_forced_agreement_with_near_ties",
                                "positions",
                                "hf_eager_vs_hf_sdpa_agreement",
                                "hf_eager_vs_hf_sdpa_agreement",
                                "overlap_on_off_identical",
                                "prefill_argmax_agreement",
                                "nan",
                                "error",
                            )
                        },
                    )
        elif k.startswith("check") and isinstance(v, dict):
            keys = (
                "teacher_forced_agreement",
                "teacher_forced_agreement_with_exact_ties",
                "teacher_forced_agreement_with_near_ties",
                "positions",
                "fp32_ref_skiff_agreement",
                "fp32_ref_hf_bf16_agreement",
                "fp32_ref_prefill_rel_err_skiff",
                "fp32_ref_prefill_rel_err_hf_bf16",
                "radix_hit_teacher_forced_agreement",
                "floor",
                "overlap_on_off_identical",
                "radix_hit_vs_miss_identical",
                "ps1_identical_to_ps16",
                "ps256_identical_to_ps16",
                "prefill_logits_rel_err_max",
                "prefill_argmax_agreement",
                "nan",
                "error",
            )
            print(k, {x: v.get(x) for x in keys if x in v})
    serve = RESULTS.get("serve") or {}
    for rate, r in (serve.get("runs") or {}).items():
        if "error" in r:
            print(f"serve rate {rate}: {r['error']}")
            continue
        print(
            f"serve rate {rate} req/s: {r['completed']} done, {r['request_throughput']:.1f} req/s, "
            f"out {r['output_throughput']:.0f} tok/s, "
            f"TTFT p50/p99 {r['ttft_ms']['p50']:.0f}/{r['ttft_ms']['p99']:.0f} ms, "
            f"TPOT p50/p99 {r['tpot_ms']['p50']:.1f}/{r['tpot_ms']['p99']:.1f} ms"
        )
    if serve.get("error"):
        print("serve", serve["error"])
    for name in ("profile_decode", "profile_decode_qwen3_8b"):
        prof = RESULTS.get(name) or {}
        if prof:
            print(
                name,
                {
                    k: prof.get(k)
                    for k in (
                        "prefill_phase",
                        "batch",
                        "wall_ms_per_step",
                        "gpu_ms_per_step_total",
                        "gpu_ms_per_step_by_category",
                        "host_ms_per_step",
                        "error",
                    )
                },
            )
    print(f"total {RESULTS.get('total_seconds')} s")


if __name__ == "__main__":
    main()

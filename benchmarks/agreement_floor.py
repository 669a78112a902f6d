"""How far two correct runs of the same weights disagree: the floor under the teacher-forced agreement bar.

Skiff (FlashInfer, CUDA graphs, overlap) greedy over 20 random prompts x 128 tokens, HF transformers on the
same random weights teacher-forced over Skiff's tokens (the bar's measure, asserted in tests/gpu), and the
controls that change only kernels or the order of fp32 sums, never the model: HF's decode path (greedy
generate with its KV cache) against HF's prefill over the same tokens, HF's SDPA backends and its eager
attention against its default, Skiff's decode against Skiff's prefill; and all of it against HF in fp32.
Each entry is (strict, counting exact ties, counting near-ties), see hf_reference.Agreement.

    python3 benchmarks/agreement_floor.py [--cpu] [--shape qwen3_0_6b]
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import torch
from harness import Bench, free, generate, hf_config, make_engine, models_dir, script_args
from hf_reference import (
    Trajectories,
    agreement,
    argmax_tokens,
    hf_greedy,
    load_reference,
    prefill,
    random_prompts,
    random_weights_model,
    relative_error,
    teacher_forced,
)


def sdpa_backends(device: str) -> list[tuple[str, Any]]:
    from torch.nn.attention import SDPBackend

    if device == "cpu":
        return [("math", SDPBackend.MATH)]
    return [
        ("math", SDPBackend.MATH),
        ("mem_efficient", SDPBackend.EFFICIENT_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
    ]


def skiff_run(bench: Bench, path: Any, prompts: Trajectories, n_new: int) -> dict[str, Any]:
    """Skiff's greedy tokens, its prefill logits over prompt + those tokens, and its prefill of the prompts."""
    from skiff.params import SamplingParams

    engine, info = make_engine(path, bench, max_total_tokens=200_000, context_length=4096)
    try:
        greedy = [SamplingParams(max_tokens=n_new, temperature=0.0, ignore_eos=True)] * len(prompts)
        tokens = generate(engine, prompts, greedy)
        own_prefill = [
            engine.prefill_logits(p + o)[len(p) - 1 : len(p) - 1 + len(o)].float()
            for p, o in zip(prompts, tokens, strict=True)
        ]
        prompt_logits = [engine.prefill_logits(p).float().cpu() for p in prompts[:4]]
    finally:
        free(engine)
    return {"tokens": tokens, "own_prefill": own_prefill, "prompt_logits": prompt_logits, "engine": info}


def hf_controls(hf: Any, prompts: Trajectories, skiff: dict[str, Any], n_new: int) -> dict[str, Any]:
    """Every control that needs the HF model in the run's dtype; one that cannot run (an SDPA backend without
    a kernel for these shapes) records its error and the others still run."""
    from torch.nn.attention import sdpa_kernel

    tokens, own_prefill = skiff["tokens"], skiff["own_prefill"]
    hf_preds = teacher_forced(hf, prompts, tokens)
    res: dict[str, Any] = {"hf_preds": hf_preds}

    def control(name: str, fn: Callable[[], Any]) -> None:
        try:
            res[name] = fn()
        except Exception as exc:  # noqa: BLE001 - recorded, the next control still runs
            res[name] = {"error": repr(exc)}

    def hf_decode() -> tuple[float, float, float]:
        own = [hf_greedy(hf, p, n_new) for p in prompts]
        return agreement(own, teacher_forced(hf, prompts, own)).as_tuple()

    def hf_kernel_vs_default(backend: Any = None, attn: str = "sdpa") -> tuple[float, float, float]:
        hf.set_attn_implementation(attn)
        try:
            with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                other = teacher_forced(hf, prompts, tokens)
        finally:
            hf.set_attn_implementation("sdpa")
        return agreement(argmax_tokens(other), hf_preds).as_tuple()

    control("skiff_decode_vs_hf_prefill", lambda: agreement(tokens, hf_preds).as_tuple())
    control("skiff_decode_vs_skiff_prefill", lambda: agreement(tokens, own_prefill).as_tuple())
    control("skiff_prefill_vs_hf_prefill", lambda: agreement(argmax_tokens(own_prefill), hf_preds).as_tuple())
    for name, backend in sdpa_backends(str(hf.device)):
        control(f"hf_sdpa_{name}_vs_hf_sdpa_default", lambda b=backend: hf_kernel_vs_default(backend=b))
    control("hf_eager_vs_hf_sdpa", lambda: hf_kernel_vs_default(attn="eager"))
    control("hf_decode_vs_hf_prefill", hf_decode)
    res["hf_prompt_logits"] = prefill(hf, prompts[:4])
    return res


def floor_section(bench: Bench, shape: str, n_prompts: int = 20, n_new: int = 128) -> dict[str, Any]:
    if bench.cpu:
        n_prompts, n_new = 6, 12
    path = models_dir() / f"{shape}{'_tiny' if bench.cpu else ''}_{str(bench.dtype)[6:]}_weights"
    hf = random_weights_model(hf_config(shape, bench.cpu), path, bench.device, bench.dtype)
    prompts = random_prompts(n_prompts, 32, 40 if bench.cpu else 400, hf.config.vocab_size)
    skiff = skiff_run(bench, path, prompts, n_new)
    res: dict[str, Any] = {"engine": skiff["engine"], "prompts": n_prompts, "positions": n_prompts * n_new}
    res.update(hf_controls(hf, prompts, skiff, n_new))
    hf_preds, hf_prompt_logits = res.pop("hf_preds"), res.pop("hf_prompt_logits")
    tokens = skiff["tokens"]
    del hf
    free()
    if not bench.cpu:  # how much of the gap is bf16 itself: both against HF in fp32
        hf32 = load_reference(path, bench.device, torch.float32)
        preds32 = teacher_forced(hf32, prompts, tokens)
        ref32 = prefill(hf32, prompts[:4])
        res["fp32_ref_agreement"] = {
            "skiff": agreement(tokens, preds32).as_tuple(),
            "hf_bf16": agreement(argmax_tokens(hf_preds), preds32).as_tuple(),
        }
        res["fp32_ref_prefill_rel_err"] = {
            "skiff": relative_error(skiff["prompt_logits"], ref32),
            "hf_bf16": relative_error(hf_prompt_logits, ref32),
        }
        del hf32
        free()
    bench.log("  ", {k: v for k, v in res.items() if k != "engine"})
    return res


def main() -> None:
    bench, args = script_args(
        __doc__,
        lambda ap: ap.add_argument("--shape", action="append", help="default: qwen3_0_6b, llama_3_2_1b"),
    )
    for shape in args.shape or ["qwen3_0_6b", "llama_3_2_1b"]:
        bench.section(f"agreement_floor_{shape}", floor_section, bench, shape)
    print(json.dumps(bench.results, indent=1, default=str))


if __name__ == "__main__":
    main()

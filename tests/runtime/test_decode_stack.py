"""The CPU decode stack (kernels/cpu_decode_stack.cpp): one call through every layer equals the layer path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize
from skiff import SamplingParams
from skiff.kernels import cpu as cpu_kernels
from skiff.models.decode_stack import DecodeStack
from skiff_rt_helpers import random_prompts

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler for the CPU kernels")

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, INTER, PAGE, LAYERS, EPS = 4, 2, 64, 128, 256, 4, 2, 1e-5


def _packed(rng: np.random.Generator, rows: int, cols: int, qtype: GGMLQuantizationType) -> list:
    raw = quantize(rng.standard_normal((rows, cols)).astype(np.float32) * 0.1, qtype)
    codes, scales, offsets = cpu_kernels.ops().gguf_pack(torch.from_numpy(raw.copy()), int(qtype), cols)
    return [codes, scales, offsets, int(qtype), rows]


def _layer(rng: np.random.Generator, qk_norm: bool, bias: bool) -> dict:
    qkv_rows = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    norm = lambda n: torch.from_numpy(1 + 0.1 * rng.standard_normal(n).astype(np.float32))  # noqa: E731
    return {
        "in": norm(HIDDEN),
        "qkv": _packed(rng, qkv_rows, HIDDEN, GGMLQuantizationType.Q4_1),
        "bias": torch.from_numpy(rng.standard_normal(qkv_rows).astype(np.float32)) if bias else None,
        "qn": norm(HEAD_DIM) if qk_norm else None,
        "kn": norm(HEAD_DIM) if qk_norm else None,
        "o": _packed(rng, HIDDEN, HEADS * HEAD_DIM, GGMLQuantizationType.Q8_0),
        "post": norm(HIDDEN),
        "gu": _packed(rng, 2 * INTER, HIDDEN, GGMLQuantizationType.Q4_0),
        "down": _packed(rng, HIDDEN, INTER, GGMLQuantizationType.Q8_0),
    }


def _linear(x: torch.Tensor, packed: list, bias: torch.Tensor | None = None) -> torch.Tensor:
    codes, scales, offsets, qtype, n = packed
    return cpu_kernels.ops().gguf_linear(x, codes, scales, offsets, qtype, n, bias, True)


def _reference(
    embeds, positions, slots, table, lens, cos_sin, k_cache, v_cache, layers, final
) -> torch.Tensor:
    """The layer path's op sequence (models/decoder.py with the fused CPU ops, attention/torch_backend.py)."""
    ops, b = cpu_kernels.ops(), embeds.shape[0]
    qw, kvw = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    residual = embeds.clone()
    x = ops.rms_norm(residual, layers[0]["in"], EPS)
    for i, w in enumerate(layers):
        if i:
            ops.add_rms_norm_(x, residual, w["in"], EPS)
        q, k, v = _linear(x, w["qkv"], w["bias"]).split([qw, kvw, kvw], dim=-1)
        if w["qn"] is not None:
            q = ops.rms_norm(q.view(b, HEADS, HEAD_DIM), w["qn"], EPS).view(b, qw)
            k = ops.rms_norm(k.view(b, KV_HEADS, HEAD_DIM), w["kn"], EPS).view(b, kvw)
        ops.rope_(q, k, positions, cos_sin, HEAD_DIM)
        k_cache[i].index_copy_(0, slots, k.view(b, KV_HEADS, HEAD_DIM).to(k_cache[i].dtype))
        v_cache[i].index_copy_(0, slots, v.reshape(b, KV_HEADS, HEAD_DIM).to(v_cache[i].dtype))
        attn = ops.paged_decode_attention(
            q.view(b, HEADS, HEAD_DIM), k_cache[i], v_cache[i], table, lens, PAGE, HEAD_DIM**-0.5
        )
        x = _linear(attn.reshape(b, qw), w["o"])
        ops.add_rms_norm_(x, residual, w["post"], EPS)
        x = _linear(ops.silu_and_mul(_linear(x, w["gu"])), w["down"])
    ops.add_rms_norm_(x, residual, final, EPS)
    return x


def _stack_weights(layers: list[dict], final: torch.Tensor) -> tuple[list[torch.Tensor], list[int]]:
    none = torch.empty(0)
    weights, qtypes = [], []
    for w in layers:
        weights += [w["in"], *w["qkv"][:3], none if w["bias"] is None else w["bias"]]
        weights += [none if w["qn"] is None else w["qn"], none if w["kn"] is None else w["kn"], *w["o"][:3]]
        weights += [w["post"], *w["gu"][:3], *w["down"][:3]]
        qtypes += [w["qkv"][3], w["o"][3], w["gu"][3], w["down"][3]]
    return [*weights, final], qtypes


@pytest.mark.parametrize(
    ("qk_norm", "bias", "kv_dtype"),
    [
        (False, False, torch.float32),
        (True, True, torch.float32),
        (True, False, torch.float16),
        (False, True, torch.bfloat16),
    ],
)
def test_stack_equals_the_layer_ops_bit_for_bit(qk_norm: bool, bias: bool, kv_dtype: torch.dtype) -> None:
    rng = np.random.default_rng(7)
    layers = [_layer(rng, qk_norm, bias) for _ in range(LAYERS)]
    final = torch.from_numpy(1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32))
    lens = torch.tensor([1, 5, 9, 13], dtype=torch.int64)  # context lengths after this step
    batch, pages = len(lens), 4
    table = torch.arange(1, 1 + batch * pages, dtype=torch.int64).view(batch, pages).flip(1).contiguous()
    positions = lens - 1
    slots = table.gather(1, (positions // PAGE).unsqueeze(1)).squeeze(1) * PAGE + positions % PAGE
    num_slots = (1 + batch * pages) * PAGE
    cache = [torch.randn(num_slots, KV_HEADS, HEAD_DIM).to(kv_dtype) for _ in range(2 * LAYERS)]
    cos_sin = torch.randn(64, HEAD_DIM)
    embeds = torch.randn(batch, HIDDEN)

    ref_k, ref_v = [c.clone() for c in cache[:LAYERS]], [c.clone() for c in cache[LAYERS:]]
    want = _reference(embeds, positions, slots, table, lens, cos_sin, ref_k, ref_v, layers, final)
    k_cache, v_cache = cache[:LAYERS], cache[LAYERS:]
    weights, qtypes = _stack_weights(layers, final)
    got = cpu_kernels.ops().decode_stack(
        embeds, positions, slots, table, lens, cos_sin, k_cache, v_cache, weights,
        [HEADS, KV_HEADS, HEAD_DIM, INTER, PAGE], qtypes, EPS, HEAD_DIM**-0.5, True,
    )  # fmt: skip
    assert torch.equal(got, want)
    for mine, theirs in zip(k_cache + v_cache, ref_k + ref_v, strict=True):
        assert torch.equal(mine, theirs)  # the new tokens' K/V landed in the same slots, rounded alike


def test_stack_rejects_a_slot_outside_the_pool() -> None:
    cache = [torch.zeros(8, KV_HEADS, HEAD_DIM)]
    with pytest.raises(RuntimeError, match="out of the pool"):
        cpu_kernels.ops().decode_stack(
            torch.zeros(1, HIDDEN), torch.zeros(1, dtype=torch.int64), torch.tensor([8]),
            torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, dtype=torch.int64), torch.zeros(4, HEAD_DIM),
            cache, cache, [torch.empty(0)] * 18, [HEADS, KV_HEADS, HEAD_DIM, INTER, PAGE], [2, 2, 2, 2],
            EPS, 1.0, True,
        )  # fmt: skip


def test_the_embedded_model_decodes_alike_with_and_without_the_stack(llm_factory, monkeypatch) -> None:
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=True)
    prompts = random_prompts(6, seed=3, lo=3, hi=90)
    stacked = llm_factory(None, quantization="auto", max_total_tokens=4096)
    assert isinstance(stacked.engine.runner.decode_stack, DecodeStack)
    calls = []
    stack_call = stacked.engine.runner.decode_stack.__call__
    monkeypatch.setattr(
        stacked.engine.runner, "decode_stack", lambda batch: calls.append(batch.num_seqs) or stack_call(batch)
    )
    with_stack = stacked.generate(prompts, sp)
    assert calls and max(calls) == len(prompts)  # the batched decode steps went through the stack
    stacked.shutdown()
    monkeypatch.setenv("SKIFF_CPU_DECODE_STACK", "0")
    layered = llm_factory(None, quantization="auto", max_total_tokens=4096)
    assert layered.engine.runner.decode_stack is None
    without = layered.generate(prompts, sp)
    assert [o.token_ids for o in with_stack] == [o.token_ids for o in without]
    assert [o.logprobs for o in with_stack] == [o.logprobs for o in without]

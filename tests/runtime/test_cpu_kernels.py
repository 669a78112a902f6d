"""Skiff's fused CPU kernels against the torch ops they replace, and the engine with them on and off."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from skiff.kernels import cpu as cpu_kernels
from skiff.layers.rotary import RopeConfig, RotaryEmbedding

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler for the CPU kernels")


@pytest.fixture(scope="module")
def k():
    return cpu_kernels.ops()


def ref_rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def test_rms_norm_on_strided_rows_and_heads(k) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 100, generator=g)
    w = torch.randn(64, generator=g)
    rows = x[:, 10:74]  # row-strided view
    torch.testing.assert_close(k.rms_norm(rows, w, 1e-6), ref_rms(rows, w, 1e-6))
    heads = x[:, :96].view(7, 3, 32)  # [T, H, D] view with a row stride of 100
    w32 = torch.randn(32, generator=g)
    torch.testing.assert_close(k.rms_norm(heads, w32, 1e-5), ref_rms(heads, w32, 1e-5))


def test_add_rms_norm_updates_both_in_place(k) -> None:
    g = torch.Generator().manual_seed(1)
    x, r, w = (
        torch.randn(5, 576, generator=g),
        torch.randn(5, 576, generator=g),
        torch.randn(576, generator=g),
    )
    xs, rs = x.clone(), r.clone()
    k.add_rms_norm_(xs, rs, w, 1e-5)
    torch.testing.assert_close(rs, x + r)
    torch.testing.assert_close(xs, ref_rms(x + r, w, 1e-5))


@pytest.mark.parametrize("rotary_dim", [64, 32])
def test_rope_matches_the_torch_rotary(k, rotary_dim: int) -> None:
    g = torch.Generator().manual_seed(2)
    rot = RotaryEmbedding(RopeConfig(rotary_dim, 10000.0, 4096), 64)
    qkv = torch.randn(9, 4 * 64 + 2 * 64 + 2 * 64, generator=g)
    q, kk = qkv[:, :256], qkv[:, 256:384]
    pos = torch.randint(0, 4096, (9,), generator=g)
    want_q, want_k = rot(pos, q.reshape(9, 4, 64).clone(), kk.reshape(9, 2, 64).clone())
    k.rope_(q, kk, pos, rot.cos_sin, 64)
    torch.testing.assert_close(q.reshape(9, 4, 64), want_q)
    torch.testing.assert_close(kk.reshape(9, 2, 64), want_k)
    with pytest.raises(RuntimeError, match="position out of range"):
        k.rope_(q, kk, torch.full((9,), 4096), rot.cos_sin, 64)


def test_silu_and_mul_and_row_normalize(k) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 2 * 300, generator=g) * 8  # large magnitudes exercise the exp range clamp
    torch.testing.assert_close(k.silu_and_mul(x), F.silu(x[:, :300]) * x[:, 300:], rtol=1e-5, atol=1e-5)
    y = torch.randn(4, 77, generator=g)
    y[2] = 0  # an all-zero row keeps its floor scale instead of dividing by zero
    xs, amax = k.row_normalize(y)
    want_amax = y.abs().amax(-1, keepdim=True).clamp_min(1e-12)
    torch.testing.assert_close(amax, want_amax)
    torch.testing.assert_close(xs, y / want_amax)


def test_argmax_rows_takes_the_first_maximum(k) -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 49152, generator=g)
    x[1, 7] = x[1, 30000] = 100.0  # a tie: the first index wins, as with torch.argmax
    x[2, -1] = 50.0
    assert torch.equal(k.argmax_rows(x), x.argmax(dim=-1))
    assert torch.equal(k.argmax_rows(x[:, 1000:2000]), x[:, 1000:2000].argmax(dim=-1))


@pytest.mark.parametrize(
    ("page_size", "hq", "hkv", "head_dim", "kv_dtype"),
    [
        (16, 9, 3, 64, torch.float32),
        (1, 4, 4, 64, torch.float32),
        (256, 8, 1, 128, torch.float32),
        (7, 6, 2, 48, torch.float32),
        (16, 9, 3, 64, torch.float16),
        (5, 8, 2, 128, torch.bfloat16),
        (3, 4, 2, 40, torch.float16),
    ],
)
def test_paged_decode_attention_matches_sdpa(
    k, page_size: int, hq: int, hkv: int, head_dim: int, kv_dtype: torch.dtype
) -> None:
    g = torch.Generator().manual_seed(4)
    lens = torch.tensor([1, page_size, page_size + 1, 37, 333])
    batch, max_pages = len(lens), int(-(-lens.max() // page_size))
    num_pages = batch * max_pages + 8
    kc = torch.randn(num_pages * page_size, hkv, head_dim, generator=g).to(kv_dtype)
    vc = torch.randn(num_pages * page_size, hkv, head_dim, generator=g).to(kv_dtype)
    table = (torch.randperm(num_pages - 1, generator=g)[: batch * max_pages] + 1).view(batch, max_pages)
    q = torch.randn(batch, hq, head_dim, generator=g)
    out = k.paged_decode_attention(q, kc, vc, table, lens, page_size, head_dim**-0.5)
    for b in range(batch):
        slots = (table[b].unsqueeze(1) * page_size + torch.arange(page_size)).reshape(-1)[: lens[b]]
        want = F.scaled_dot_product_attention(
            q[b].unsqueeze(1),
            kc[slots].float().transpose(0, 1),
            vc[slots].float().transpose(0, 1),
            enable_gqa=True,
        ).squeeze(1)
        torch.testing.assert_close(out[b], want, rtol=1e-4, atol=1e-5)
    # alone, a sequence is split by KV head across the threads (in a batch it is one work item): same bits
    one = k.paged_decode_attention(
        q[-1:], kc, vc, table[-1:].contiguous(), lens[-1:], page_size, head_dim**-0.5
    )
    assert torch.equal(one[0], out[-1])


@pytest.mark.parametrize(
    ("rows", "k_dim", "n"), [(1, 576, 960), (2, 64, 8), (5, 100, 7), (16, 1536, 576), (33, 33, 13)]
)
def test_int8_linear_is_exactly_its_integer_arithmetic(k, rows: int, k_dim: int, n: int) -> None:
    """Against the same quantization done in torch: 7-bit activation codes per row, 8-bit weights per channel."""
    g = torch.Generator().manual_seed(rows)
    x, w, b = (
        torch.randn(rows, k_dim, generator=g),
        torch.randn(n, k_dim, generator=g) * 0.05,
        torch.randn(n, generator=g),
    )
    x[0] = 0.0  # an all-zero row must come out as the bias, not as NaN
    packed, scale, colsum = k.int8_pack_weight(w)
    w_amax = w.abs().amax(1)
    torch.testing.assert_close(scale, w_amax / 127)
    wq = (w / (w_amax / 127)[:, None]).round().clamp(-127, 127)
    assert colsum[:n].tolist() == wq.sum(1).int().tolist()
    x_amax = x.abs().amax(1)
    xq = (x * torch.where(x_amax > 0, 63.0 / x_amax, 0.0)[:, None]).round()
    want = (xq.double() @ wq.double().t()) * (x_amax / 63).double()[:, None] * scale.double() + b.double()
    torch.testing.assert_close(
        k.int8_linear(x, packed, scale, colsum, b).double(), want, rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(
        k.int8_linear(x, packed, scale, colsum, None).double(), want - b.double(), rtol=1e-5, atol=1e-5
    )
    with pytest.raises(RuntimeError, match="does not match"):
        k.int8_linear(torch.zeros(rows, k_dim + 32), packed, scale, colsum, None)


def test_paged_decode_attention_rejects_a_page_outside_the_pool(k) -> None:
    kc = torch.zeros(64, 1, 64)
    with pytest.raises(RuntimeError, match="page out of pool"):
        k.paged_decode_attention(
            torch.zeros(1, 1, 64), kc, kc, torch.tensor([[4]]), torch.tensor([16]), 16, 0.125
        )


GREEDY = """
import json, sys
from skiff import LLM, SamplingParams
llm = LLM(model=None, dtype="float32", quantization="none", num_threads=2, max_total_tokens=4096,
          kv_cache_dtype=sys.argv[1])
prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
print(json.dumps([o.token_ids for o in outs]))
"""


def greedy(disable_kernels: bool, kv_cache_dtype: str = "auto") -> list[list[int]]:
    env = dict(os.environ, SKIFF_DISABLE_FUSED_OPS="1" if disable_kernels else "0")
    out = subprocess.run(
        [sys.executable, "-c", GREEDY, kv_cache_dtype], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_engine_greedy_tokens_equal_with_and_without_the_kernels() -> None:
    assert greedy(False) == greedy(True)


def test_fp16_kv_cache_keeps_greedy_output_close_on_both_paths() -> None:
    """fp16 K/V round each cached value once; over 3 x 24 greedy tokens the embedded model's choices hold."""
    want = greedy(False)
    for disable in (False, True):  # the decode kernel, and the pure-torch gather + SDPA path
        got = greedy(disable, "float16")
        same = sum(a == b for w, g in zip(want, got, strict=True) for a, b in zip(w, g, strict=True))
        assert same >= 0.9 * sum(len(w) for w in want), (disable, got, want)
        assert all(g[:8] == w[:8] for w, g in zip(want, got, strict=True)), (disable, got, want)


def test_a_prebuilt_library_is_loaded_from_skiff_kernels_dir(k, tmp_path) -> None:
    """An image ships the library prebuilt (SKIFF_KERNELS_DIR, read-only); a fresh cache dir builds nothing."""
    built = cpu_kernels._library_path()
    prebuilt = tmp_path / "prebuilt"
    prebuilt.mkdir()
    (prebuilt / built.name).write_bytes(built.read_bytes())
    prebuilt.chmod(0o555)
    code = "from skiff.kernels import cpu; assert cpu.available(); print(cpu._library_path())"
    # CXX=false: a build attempt would fail, so passing means the prebuilt file was loaded.
    env = {
        **os.environ,
        "SKIFF_KERNELS_DIR": str(prebuilt),
        "SKIFF_CACHE_DIR": str(tmp_path / "cache"),
        "CXX": "false",
    }
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(prebuilt / built.name)
    assert not (tmp_path / "cache" / "kernels").exists()

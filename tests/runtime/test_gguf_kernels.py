"""The GGUF linear kernels (kernels/cpu_gguf.cpp) against dequantize-then-matmul on random blocks of each format.

Error bound. The kernel computes, per 32-value block b of a row x and output n, with the weight's values
w = d q + m (m = 0 for the signed formats):
    dw dx sum_i q_i xq_i  +  m sum_i x_i,        xq_i = round(x_i / dx), dx = amax_b / 127,
so the weight's numbers are exact and the only approximation is x_i ~ dx xq_i, off by at most dx / 2:
    |y - x . w| <= sum_b (amax_b / 254) sum_{i in b} |d q_i|   (+ fp32 rounding)
where |d q_i| = |w_i - m_i|. The fp32 rounding of the scale products, the block accumulation and the exact
block sums adds well under 1e-5 of sum_i |x_i| (|w_i| + |m_i|) at these widths (< 100 roundings of 6e-8).
Activations that are exactly int8 per block (integers up to 127 times a power of two) make the first term 0,
so there the kernel must equal the reference to fp32 rounding. `precise` activations add a second int8
term for the residual r = x - dx xq, |r| <= dx / 2: its own step is amax(r) / 127 <= amax_b / (127 * 254), so
the first term of the bound shrinks by 254.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize
from skiff.kernels import cpu as cpu_kernels
from skiff.layers.gguf_quant import GGUFLinear, GGUFWeight

T = GGMLQuantizationType

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler for the CPU kernels")


def _f16(rng: np.random.Generator, n: int, lo: float, hi: float, signed: bool) -> np.ndarray:
    v = rng.uniform(lo, hi, n) * (rng.choice([-1.0, 1.0], n) if signed else 1.0)
    return v.astype(np.float16).view(np.uint8).reshape(n, 2)


# type -> (byte ranges of fp16 fields with their value ranges, byte range of the integer codes, signed codes)
FIELDS = {
    T.Q4_0: ([(0, 0.002, 0.05, True)], (2, 18), False),
    T.Q4_1: ([(0, 0.002, 0.05, False), (2, 0.05, 0.5, True)], (4, 20), False),
    T.Q8_0: ([(0, 0.0005, 0.01, True)], (2, 34), True),
    T.Q4_K: ([(0, 0.0005, 0.005, False), (2, 0.0005, 0.005, False)], (16, 144), False),
    T.Q6_K: ([(208, 0.0005, 0.005, False)], (0, 192), True),
}


def random_weight(qtype: T, rows: int, cols: int, seed: int) -> GGUFWeight:
    rng = np.random.default_rng(seed)
    bv, bb = GGML_QUANT_SIZES[qtype]
    blocks = rows * cols // bv
    raw = rng.integers(0, 256, (blocks, bb), dtype=np.uint8)
    for offset, lo, hi, signed in FIELDS[qtype][0]:
        raw[:, offset : offset + 2] = _f16(rng, blocks, lo, hi, signed)
    return GGUFWeight(raw.reshape(rows, cols // bv * bb), qtype, cols)


def offsets(w: GGUFWeight) -> np.ndarray:
    """m per value: the dequantized weight with every integer code zeroed (0 for the signed formats)."""
    _, (lo, hi), signed = FIELDS[w.qtype]
    if signed:
        return np.zeros(w.shape)
    bv, bb = GGML_QUANT_SIZES[w.qtype]
    blocks = w.raw.reshape(-1, bb).copy()
    blocks[:, lo:hi] = 0
    return dequantize(blocks.reshape(w.raw.shape), w.qtype).astype(np.float64).reshape(w.shape)


def bound(x: np.ndarray, w: np.ndarray, m: np.ndarray, precise: bool) -> np.ndarray:
    amax = np.abs(x.reshape(x.shape[0], -1, 32)).max(-1) / (254.0 if precise else 1.0)
    step = np.repeat(amax / 254.0 * (1 + 1e-4), 32, axis=1)  # |x_i - dx xq_i|, with 127/amax's own rounding
    slack = 1e-5 * np.abs(x) @ (np.abs(w) + np.abs(m)).T
    return step @ np.abs(w - m).T + slack


# (rows of x, outputs): a short last group of 8 (20, 44); odd group counts (24, 40), so a last group runs
# alone; odd rows beside tiles of 2 (U4) and 4 (S8) rows; more rows than one cache tile (70, 130)
SHAPES = [(1, 20), (2, 16), (3, 8), (5, 24), (16, 48), (70, 40), (130, 44)]


@pytest.mark.parametrize("precise", [True, False], ids=["precise", "int8"])
@pytest.mark.parametrize("qtype", list(FIELDS), ids=lambda t: t.name)
@pytest.mark.parametrize(("m", "n"), SHAPES)
def test_kernel_within_activation_quantization_bound(qtype: T, m: int, n: int, precise: bool) -> None:
    k = 512
    weight = random_weight(qtype, n, k, seed=m * 100 + n)
    w = dequantize(weight.raw, qtype).astype(np.float64).reshape(n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(n)) * 2
    x[0, 5] = 30.0  # an outlier coarsens only its own block
    got = GGUFLinear(weight, precise=precise)(x).double().numpy()
    xd = x.double().numpy()
    ref = xd @ w.T
    err = np.abs(got - ref)
    tol = bound(xd, w, offsets(weight), precise)
    assert (err <= tol).all(), f"max excess {(err - tol).max():.3g}, max error {err.max():.3g}"
    assert err.max() > 0  # activations were really quantized (a float path would be exact to 1e-6)


@pytest.mark.parametrize("qtype", list(FIELDS), ids=lambda t: t.name)
def test_kernel_exact_on_int8_activations(qtype: T) -> None:
    m, n, k = 6, 16, 256
    weight = random_weight(qtype, n, k, seed=7)
    w = dequantize(weight.raw, qtype).astype(np.float64).reshape(n, k)
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(-127, 128, (m, k // 32, 32), generator=g).float()
    codes[:, :, 0] = 127.0  # amax of every block is 127 codes: the block's scale is its power of two
    scale = 2.0 ** torch.randint(-6, 3, (m, k // 32, 1), generator=g).float()
    x = (codes * scale).reshape(m, k)
    bias = torch.randn(n, generator=g)
    got = GGUFLinear(weight, bias, precise=False)(x).double().numpy()
    ref = x.double().numpy() @ w.T + bias.double().numpy()
    slack = 1e-5 * np.abs(x.double().numpy()) @ (np.abs(w) + np.abs(offsets(weight))).T + 1e-6
    assert (np.abs(got - ref) <= slack).all(), np.abs(got - ref).max()


def test_kernel_keeps_leading_dims_and_rejects_bad_shapes() -> None:
    weight = random_weight(T.Q4_1, 8, 64, seed=3)
    lin = GGUFLinear(weight)
    x = torch.randn(2, 3, 64)
    assert lin(x).shape == (2, 3, 8)
    torch.testing.assert_close(lin(x), lin(x.reshape(6, 64)).view(2, 3, 8))
    with pytest.raises(RuntimeError, match="does not match"):
        lin(torch.randn(4, 96))
    with pytest.raises(ValueError, match="does not hold"):
        GGUFWeight(weight.raw[:, :-1], T.Q4_1, 64)
    with pytest.raises(ValueError, match="no GGUF kernel"):
        GGUFLinear(GGUFWeight(np.zeros((2, 64 * 2), np.uint8), T.F16, 64))


def test_rows_permuted_and_sliced_as_blocks() -> None:
    weight = random_weight(T.Q8_0, 16, 64, seed=4)
    full = weight.dequantize()
    heads = 2
    want = full.reshape(heads, 4, 2, 64).transpose(1, 2).reshape(16, 64)
    torch.testing.assert_close(weight.permute_rows(heads).dequantize(), want, rtol=0, atol=0)
    torch.testing.assert_close(weight.take_cols(32, 64).dequantize(), full[:, 32:], rtol=0, atol=0)
    with pytest.raises(ValueError, match="split"):
        weight.take_cols(16, 64)

"""Skiff's GPU Triton kernels, run on CPU in Triton's interpreter, against HF transformers' torch code.

The kernels round where HF rounds, so nearly every output element is bit-equal to HF's; a wrong index,
stride, mask or rounding point shows as a large unequal fraction. Not all are equal: the interpreter's
sums run in another order and its exp is numpy's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# find_spec, not an import: triton stays out of the test process (the kernels run in a subprocess)
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is in the dev extras (scripts/install.sh --dev)",
)


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, float]]:
    here = Path(__file__).parent
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, str(here / "triton_interp_cases.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=here,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_kernels_are_bit_equal_to_hf_in_half_precision(results, dtype: str) -> None:
    got = results[dtype]
    assert len(got) == 9
    low = {k: eq for k, (eq, _) in got.items() if eq < 0.999}
    assert not low, f"{dtype}: fractions of elements bit-equal to HF below 0.999: {low}"


def test_kernels_match_hf_in_fp32(results) -> None:
    """No rounding to absorb the interpreter's other summation order: equal to fp32 precision instead."""
    far = {k: rel for k, (_, rel) in results["float32"].items() if rel > 1e-6}
    assert not far, f"float32: relative differences from HF above 1e-6: {far}"

"""The GPU-only code paths import on a CPU machine, without FlashInfer, and choose nothing GPU for CPU tensors."""

from __future__ import annotations

import os
import subprocess
import sys

GPU_MODULES = (
    "skiff.attention.flashinfer_backend",
    "skiff.engine.cuda_graph",
    "skiff.engine.engine",
    "skiff.kernels.triton_ops",
    "skiff.layers.fused",
)


def test_gpu_modules_import_without_cuda_or_flashinfer() -> None:
    code = (
        "import importlib, sys, torch\n"
        f"for m in {GPU_MODULES!r}:\n"
        "    importlib.import_module(m)\n"
        "assert not torch.cuda.is_available()\n"
        "assert 'flashinfer' not in sys.modules\n"
        "from skiff.layers import fused\n"
        "assert not fused.enabled(torch.ones(2, 4, dtype=torch.bfloat16))  # CPU bf16: the torch ops\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_unknown_fused_ops_provider_is_a_clear_error() -> None:
    code = (
        "from skiff.layers import fused\n"
        "try:\n"
        "    fused.gpu_ops()\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, SKIFF_FUSED_OPS="cudnn"),
    )
    assert "SKIFF_FUSED_OPS='cudnn': choose one of ['flashinfer', 'triton']" in proc.stdout, proc.stderr[
        -2000:
    ]

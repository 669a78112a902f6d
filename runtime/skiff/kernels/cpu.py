"""Skiff's CPU kernels (fused fp32 ops in cpu_kernels.cpp, the int8 linear in cpu_int8.cpp, linears on GGUF
blocks in cpu_gguf.cpp, paged decode attention, a decode step through all layers in cpu_decode_stack.cpp),
compiled on first use into one library and loaded as `torch.ops.skiff_cpu`.

The library is built with the machine's C++ compiler against the installed torch (about 10 s, once) and
cached under the Skiff cache directory, keyed by the source, the torch version and the CPU's flags
(`-march=native` code must not move to another CPU). Concurrent first uses build once: the others wait on a
file lock. Without a compiler, or with `SKIFF_DISABLE_FUSED_OPS=1`, `available()` is False and the layers
keep their pure-torch path.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import time
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCES = [
    Path(__file__).with_name(name)
    for name in (
        "cpu_kernels.cpp",
        "cpu_int8.cpp",
        "cpu_gguf.cpp",
        "cpu_decode_attention.cpp",
        "cpu_decode_stack.cpp",
    )
]
HEADERS = [Path(__file__).with_name(name) for name in ("cpu_ops.h", "cpu_parallel.h")]


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def _library_path() -> Path:
    from skiff.tokenizer import cache_dir

    sources = b"".join(src.read_bytes() for src in SOURCES + HEADERS)
    key = hashlib.sha256(sources + torch.__version__.encode() + _cpu_flags().encode()).hexdigest()[:16]
    name = f"skiff_cpu_{key}.so"
    # An image ships the library prebuilt (read-only) for the CPU it was built on; any other CPU builds its own.
    prebuilt = os.environ.get("SKIFF_KERNELS_DIR")
    if prebuilt and (Path(prebuilt) / name).exists():
        return Path(prebuilt) / name
    return cache_dir() / "kernels" / name


def _compile(out: Path, cxx: str) -> None:
    from torch.utils.cpp_extension import include_paths

    torch_lib = str(Path(torch.__file__).parent / "lib")
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    cmd = [
        cxx,
        "-O3",
        "-march=native",
        "-fopenmp",
        "-fno-math-errno",
        "-fno-trapping-math",
        "-shared",
        "-fPIC",
        "-std=c++20",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        *[f"-I{p}" for p in include_paths()],
        *map(str, SOURCES),
        "-o",
        str(tmp),
        f"-L{torch_lib}",
        f"-Wl,-rpath,{torch_lib}",
        "-ltorch_cpu",
        "-lc10",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"{cxx} failed:\n{proc.stderr[-4000:]}")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


@cache
def available() -> bool:
    """Build (once) and load the kernels; False, with one log line, where that is not possible."""
    if os.environ.get("SKIFF_DISABLE_FUSED_OPS") == "1":
        return False
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    lib = _library_path()
    if not lib.exists():
        if cxx is None:
            log.info("no C++ compiler found: CPU kernels off, the pure-torch ops run instead")
            return False
        try:
            lib.parent.mkdir(parents=True, exist_ok=True)
            with open(lib.with_suffix(".lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not lib.exists():
                    t0 = time.monotonic()
                    _compile(lib, cxx)
                    log.info("built Skiff's CPU kernels in %.1f s", time.monotonic() - t0)
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            log.warning("could not build Skiff's CPU kernels, the pure-torch ops run instead: %s", e)
            return False
    torch.ops.load_library(str(lib))
    return True


def usable(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == torch.float32 and available()


def ops() -> torch._ops._OpNamespace:
    return torch.ops.skiff_cpu

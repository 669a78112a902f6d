"""Per model step cost of the linears of the embedded SmolLM2-135M (30 layers + LM head, every row through
both), three ways side by side: GGUF blocks (kernels/cpu_gguf.cpp, precise activations, what
`--quantization gguf` runs), Skiff's int8 kernel (`--quantization int8`) and fp32 F.linear on the blocks
dequantized (`--quantization none`).

Every layer's own weights are used, so at small batches the weights stream from DRAM as in a real step. The
variants take turns within each repeat and the minimum is kept, so a shared machine's load hits all three
alike. `--cpu-time` (with `--threads 1`) times the thread's CPU time instead of the wall clock: on a loaded
machine that removes the time spent waiting for a core, not the sharing of caches.

    python benchmarks/gguf_linear.py --rows 1 16 128 512 --repeats 5
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from gguf import GGUFReader
from skiff.embedded import embedded_model_path
from skiff.layers.gguf_quant import GGUFLinear, GGUFWeight, concat_rows
from skiff.layers.quant import Int8Linear

LAYER_KINDS = ("attn_qkv", "attn_output", "ffn_gate_up", "ffn_down")


def load_weights() -> list[GGUFWeight]:
    reader = GGUFReader(str(embedded_model_path()))
    by_name = {t.name: t for t in reader.tensors}

    def weight(name: str) -> GGUFWeight:
        t = by_name[name]
        return GGUFWeight(t.data, t.tensor_type, int(t.shape[0]))

    out = []
    layers = 1 + max(int(n.split(".")[1]) for n in by_name if n.startswith("blk."))
    for i in range(layers):
        for parts in (
            ("attn_q", "attn_k", "attn_v"),
            ("attn_output",),
            ("ffn_gate", "ffn_up"),
            ("ffn_down",),
        ):
            out.append(concat_rows([weight(f"blk.{i}.{p}.weight") for p in parts]))
    out.append(weight("token_embd.weight"))  # the tied LM head
    return out


def step_seconds(kernels: list, xs: dict[int, torch.Tensor], clock: Callable[[], float]) -> float:
    t0 = clock()
    for kern, k in kernels:
        kern(xs[k])
    return clock() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 128, 512])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpu-time", action="store_true", help="time CPU time of this thread (use --threads 1)")
    ap.add_argument("--skip-fp32", action="store_true")
    args = ap.parse_args()
    if args.cpu_time and args.threads != 1:
        ap.error("--cpu-time counts this thread only: use it with --threads 1")
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.cpu_time else time.perf_counter
    weights = load_weights()
    floats = [w.dequantize() for w in weights]
    variants: dict[str, list] = {
        "gguf": [(GGUFLinear(w), w.cols) for w in weights],
        "int8": [(Int8Linear(f), f.shape[1]) for f in floats],
    }
    if not args.skip_fp32:
        variants["fp32"] = [((lambda x, f=f: F.linear(x, f)), f.shape[1]) for f in floats]
    nbytes = sum(w.raw.nbytes for w in weights)
    print(
        f"{len(weights)} linears, {nbytes / 1e6:.1f} MB of GGUF blocks, {args.threads} threads, "
        f"{'CPU' if args.cpu_time else 'wall'} time, min of {args.repeats}"
    )
    print("rows " + "".join(f"{name + ' ms':>10}" for name in variants) + "  int8/gguf  fp32/gguf")
    for rows in args.rows:
        xs = {k: torch.randn(rows, k) for k in {w.cols for w in weights}}
        best = dict.fromkeys(variants, float("inf"))
        for _ in range(args.repeats):
            for name, kernels in variants.items():
                best[name] = min(best[name], step_seconds(kernels, xs, clock))
        ms = {name: t * 1e3 for name, t in best.items()}
        ratios = f"{ms['int8'] / ms['gguf']:10.2f} " + (
            f"{ms['fp32'] / ms['gguf']:10.2f}" if "fp32" in ms else ""
        )
        print(f"{rows:4d} " + "".join(f"{v:10.2f}" for v in ms.values()) + ratios, flush=True)


if __name__ == "__main__":
    main()

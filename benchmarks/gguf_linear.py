"""Per decode step cost of the linears of the embedded SmolLM2-135M (30 layers + LM head), three ways:
GGUF blocks (kernels/cpu_gguf.cpp), Skiff's int8 kernel (`--quantization int8`) and fp32 F.linear.

Every layer's own weights are used, so at small batches the weights stream from DRAM as in a real step.

    python benchmarks/gguf_linear.py --rows 1 16 128 512 --repeats 7
"""

from __future__ import annotations

import argparse
import time

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


def step_ms(kernels: list, rows: int, repeats: int) -> float:
    xs = {k: torch.randn(rows, k) for k in {kern_in for _, kern_in in kernels}}
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for kern, k in kernels:
            kern(xs[k])
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 128, 512])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-fp32", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    weights = load_weights()
    gguf = [(GGUFLinear(w), w.cols) for w in weights]
    floats = [w.dequantize() for w in weights]
    int8 = [(Int8Linear(f), f.shape[1]) for f in floats]
    fp32 = [((lambda x, f=f: F.linear(x, f)), f.shape[1]) for f in floats]
    nbytes = sum(w.raw.nbytes for w in weights)
    print(f"{len(weights)} linears, {nbytes / 1e6:.1f} MB of GGUF blocks")
    print("rows  gguf ms  int8 ms  fp32 ms  gguf GB/s")
    for rows in args.rows:
        g = step_ms(gguf, rows, args.repeats)
        i = step_ms(int8, rows, args.repeats)
        f = float("nan") if args.skip_fp32 else step_ms(fp32, rows, max(1, args.repeats // 2))
        print(f"{rows:4d} {g:8.2f} {i:8.2f} {f:8.2f} {nbytes / g / 1e6:9.1f}")


if __name__ == "__main__":
    main()

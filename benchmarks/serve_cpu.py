"""Serving benchmark on CPU: `skiff bench serve` against `skiff serve` (embedded SmolLM2-135M-Instruct),
single stream and 16 concurrent streams, with HF transformers single-stream decode measured in the same run.

    python benchmarks/serve_cpu.py [--output-len 128] [--input-len 128] [--json out.json] [-- SERVE FLAGS]

The 16-way CPU numbers in docs/performance.md use `-- --quantization int8 --kv-cache-dtype float16`.

Single-stream decode rate = 1 / TPOT (time per output token after the first); the HF number is
(new tokens - 1) / (generate time - time of a 1-token generate) on the same prompt, fp32, greedy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time

from servers import free_port, start, stop, wait_healthy
from skiff.bench import serve_client as sc
from skiff.bench.workloads import PromptMaker, random_workload
from skiff.embedded import EMBEDDED_NAME, embedded_model_path
from skiff.tokenizer import load_tokenizer


def start_server(extra: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = start(["serve", "--log-level", "warning", *extra], port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, 600)
    except (RuntimeError, TimeoutError) as exc:
        stop([proc])
        raise SystemExit(f"skiff serve did not start: {exc}") from exc
    return proc, url


def bench(url: str, tok, num: int, concurrency: int, input_len: int, output_len: int, seed: int) -> dict:
    maker = PromptMaker(tok, random.Random(seed))
    reqs = random_workload(maker, num, input_len, output_len, 1.0, as_ids=False)
    target = sc.ServeTarget(url + "/v1", EMBEDDED_NAME)
    warm = [sc.BenchRequest(reqs[0].prompt, reqs[0].prompt_len, 8)]
    asyncio.run(sc.run_load(target, warm, float("inf"), None, seed, progress=False))
    results, duration = asyncio.run(sc.run_load(target, reqs, float("inf"), concurrency, seed))
    summary = sc.summarize(results, duration)
    print(sc.format_summary(summary), flush=True)
    return summary


def hf_single_stream(tok, input_len: int, output_len: int, seed: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    path = embedded_model_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    maker = PromptMaker(tok, random.Random(seed))
    ids = torch.tensor([maker.ids(input_len)])

    def gen(n: int) -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                ids,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                attention_mask=torch.ones_like(ids),
                pad_token_id=tok.eos_token_id,
            )
        assert out.shape[1] == ids.shape[1] + n
        return time.perf_counter() - t0

    gen(8)  # warm-up
    prefill = min(gen(1) for _ in range(2))
    total = gen(output_len)
    rate = (output_len - 1) / (total - prefill)
    print(
        f"HF transformers fp32 single stream: {rate:.1f} tok/s decode ({total:.2f} s for {output_len} tokens)",
        flush=True,
    )
    return {"decode_tok_s": rate, "generate_seconds": total, "prefill_seconds": prefill}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--single-requests", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--concurrent-requests", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("server_args", nargs="*", help="extra `skiff serve` flags (after --)")
    args = ap.parse_args()
    tok = load_tokenizer(embedded_model_path())
    proc, url = start_server(args.server_args)
    try:
        print("== skiff serve, single stream", flush=True)
        single = bench(url, tok, args.single_requests, 1, args.input_len, args.output_len, args.seed)
        print(f"== skiff serve, {args.concurrency} concurrent streams", flush=True)
        multi = bench(
            url,
            tok,
            args.concurrent_requests,
            args.concurrency,
            args.input_len,
            args.output_len,
            args.seed + 1,
        )
    finally:
        stop([proc])
    hf = None if args.skip_hf else hf_single_stream(tok, args.input_len, args.output_len, args.seed)
    single_rate = 1000.0 / single["tpot_ms"]["mean"] if single["tpot_ms"]["mean"] else 0.0
    report = {
        "input_len": args.input_len,
        "output_len": args.output_len,
        "skiff_single": single,
        "skiff_single_decode_tok_s": single_rate,
        "skiff_concurrent": multi,
        "skiff_concurrent_output_tok_s": multi["output_throughput"],
        "hf_single": hf,
    }
    print("\n| measurement | value |\n|---|---|")
    print(f"| skiff serve, 1 stream, decode (1/TPOT) | {single_rate:.1f} tok/s |")
    print(f"| skiff serve, 1 stream, TTFT p50 | {single['ttft_ms']['p50']:.0f} ms |")
    print(
        f"| skiff serve, {args.concurrency} streams, aggregate output | {multi['output_throughput']:.1f} tok/s |"
    )
    print(
        f"| skiff serve, {args.concurrency} streams, TPOT p50 / p99 | {multi['tpot_ms']['p50']:.0f} / "
        f"{multi['tpot_ms']['p99']:.0f} ms |"
    )
    if hf:
        print(f"| HF transformers fp32 generate, 1 stream, decode | {hf['decode_tok_s']:.1f} tok/s |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

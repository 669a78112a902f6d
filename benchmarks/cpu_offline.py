"""CPU offline throughput: Skiff vs HF transformers generate on the embedded SmolLM2-135M-Instruct.

Measures, in one run on the same weights (the GGUF dequantized to fp32) and the same thread count:
  - HF transformers `generate`, greedy, one stream;
  - Skiff, greedy, one stream;
  - Skiff, N concurrent requests (aggregate output tokens per second of the whole generate call).
Every request generates exactly --new-tokens tokens (EOS ignored). The HF and Skiff runs alternate for
--repeats rounds and the best of each is reported, so that a noisy machine hurts both alike.

    python3 benchmarks/cpu_offline.py --threads 2 --new-tokens 128 --concurrency 16
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch
from hf_reference import hf_greedy

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Why is the sky blue?",
    "Give me a recipe for pancakes.",
    "Explain recursion to a child.",
    "What does a compiler do?",
    "Name three planets of the solar system.",
    "Tell me a short joke about computers.",
    "What is photosynthesis?",
    "How do I reverse a list in Python?",
    "Who wrote Romeo and Juliet?",
    "Summarize the plot of Cinderella.",
    "What are the primary colors?",
    "Describe a cat.",
    "How many days are in a leap year?",
    "Suggest a name for a pet goldfish.",
]


def chat_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def hf_single_stream(model, prompt: list[int], new_tokens: int) -> float:
    t0 = time.perf_counter()
    out = hf_greedy(model, prompt, new_tokens)
    dt = time.perf_counter() - t0
    assert len(out) == new_tokens
    return new_tokens / dt


def skiff_run(llm, prompts: list[list[int]], new_tokens: int) -> float:
    from skiff import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    total = sum(len(o.token_ids) for o in outs)
    assert total == new_tokens * len(prompts)
    return total / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    from skiff import LLM
    from skiff.embedded import embedded_model_path
    from transformers import AutoModelForCausalLM

    path = embedded_model_path()
    llm = LLM(model=None, dtype="float32", num_threads=args.threads, max_total_tokens=16384)
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    torch.set_num_threads(args.threads)
    tok = llm.tokenizer
    single = chat_ids(tok, QUESTIONS[0])
    batch = [
        chat_ids(tok, QUESTIONS[i % len(QUESTIONS)]) + [198] * (i // len(QUESTIONS))
        for i in range(args.concurrency)
    ]

    # warm-up (the radix cache is irrelevant here: each request's prompt is short next to its output)
    hf_single_stream(hf, single, 8)
    skiff_run(llm, [single], 8)
    skiff_run(llm, batch, 8)

    res: dict[str, list[float]] = {"hf_single": [], "skiff_single": [], "skiff_concurrent": []}
    for _ in range(args.repeats):
        res["hf_single"].append(hf_single_stream(hf, single, args.new_tokens))
        res["skiff_single"].append(skiff_run(llm, [single], args.new_tokens))
        res["skiff_concurrent"].append(skiff_run(llm, batch, args.new_tokens))
    best = {k: max(v) for k, v in res.items()}
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs visible, torch threads {args.threads}",
        "load_average": os.getloadavg(),
        "torch": torch.__version__,
        "new_tokens": args.new_tokens,
        "concurrency": args.concurrency,
        "runs_tok_per_s": res,
        "best_tok_per_s": best,
        "single_vs_hf": best["skiff_single"] / best["hf_single"],
        "concurrent_vs_hf_single": best["skiff_concurrent"] / best["hf_single"],
    }
    llm.shutdown()
    print(f"HF transformers generate, 1 stream : {best['hf_single']:8.1f} tok/s")
    print(
        f"Skiff, 1 stream                    : {best['skiff_single']:8.1f} tok/s  "
        f"({report['single_vs_hf']:.2f}x HF; bar >= 1x)"
    )
    print(
        f"Skiff, {args.concurrency} concurrent (aggregate)     : {best['skiff_concurrent']:8.1f} tok/s  "
        f"({report['concurrent_vs_hf_single']:.2f}x HF single; bar >= 6x)"
    )
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()

"""The cost of constrained decoding: output tokens/s with and without a JSON schema, same engine, same run.

Both arms generate exactly `--max-tokens` tokens per request (ignore_eos; the schema is an array whose
minimum length the budget never reaches), so the rates compare the same work: the constrained arm pays for
its matchers' masks, their transfer and the masked sampling. Arms alternate for `--reps` rounds and the
best round counts (this machine's other load only slows a round down).

    python benchmarks/constrained_decoding.py                      # the embedded SmolLM2 on CPU
    python benchmarks/constrained_decoding.py --model DIR --device cuda
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from skiff import LLM, SamplingParams  # noqa: E402
from skiff.constrained.grammar import Grammar  # noqa: E402

ITEM = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 9999},
        "name": {"type": "string", "maxLength": 12},
        "kind": {"enum": ["cat", "dog", "fish", "bird"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    },
    "required": ["id", "name", "kind", "tags"],
    "additionalProperties": False,
}
SCHEMA = {"type": "array", "items": ITEM, "minItems": 200}
PROMPT = "List the animals in the shelter as JSON records with id, name, kind and tags."


def run_arm(llm: LLM, streams: int, max_tokens: int, grammar: Grammar | None) -> tuple[float, int]:
    params = [
        SamplingParams(max_tokens=max_tokens, temperature=0.8, seed=i, ignore_eos=True, grammar=grammar)
        for i in range(streams)
    ]
    t0 = time.perf_counter()
    outs = llm.generate([PROMPT] * streams, params)
    elapsed = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for o in outs)
    if grammar is not None:
        assert all(o.text.startswith("[{") for o in outs), outs[0].text[:80]
    return tokens / elapsed, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    llm = LLM(args.model, device=args.device)
    grammar = Grammar("json_schema", json.dumps(SCHEMA))
    run_arm(llm, 2, 8, grammar)  # warm-up: the tokenizer view, kernels, the first matcher
    rows = []
    for streams in args.streams:
        best = {"plain": 0.0, "json_schema": 0.0}
        for _ in range(args.reps):
            for arm, g in (("plain", None), ("json_schema", grammar)):
                rate, tokens = run_arm(llm, streams, args.max_tokens, g)
                assert tokens == streams * args.max_tokens, tokens
                best[arm] = max(best[arm], rate)
        rows.append((streams, best["plain"], best["json_schema"]))
    print(
        f"| streams | plain tok/s | json_schema tok/s | ratio |  ({args.model or 'embedded'}, {args.device})"
    )
    print("|---:|---:|---:|---:|")
    for streams, plain, constrained in rows:
        print(f"| {streams} | {plain:,.0f} | {constrained:,.0f} | {constrained / plain:.1%} |")


if __name__ == "__main__":
    main()

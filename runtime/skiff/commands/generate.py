"""`skiff generate`: offline generation from prompts on the command line (the in-process engine)."""

from __future__ import annotations

import argparse
import json
import sys

from skiff.commands.serve import add_engine_arguments, engine_config

REQUIRES = ("torch",)  # checked by skiff.cli before the command runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompts", nargs="*", help="prompts (default: one per line on stdin)")
    parser.add_argument(
        "--chat", action="store_true", help="wrap each prompt as a user message (chat template)"
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--seed", dest="sampling_seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from skiff import LLM, InvalidRequest, SamplingParams

    prompts = args.prompts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not prompts:
        print("skiff generate: no prompts", file=sys.stderr)
        return 2
    try:
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            seed=args.sampling_seed,
            stop=args.stop,
            ignore_eos=args.ignore_eos,
        )
        cfg = engine_config(args)
    except (InvalidRequest, ValueError) as e:
        print(f"skiff generate: {e}", file=sys.stderr)
        return 2
    kwargs = {k: v for k, v in vars(cfg).items() if k not in ("model", "tokenizer")}
    with LLM(cfg.model, cfg.tokenizer, **kwargs) as llm:
        inputs: list[str | list[int]] = list(prompts)
        if args.chat:
            inputs = [
                llm.tokenizer.apply_chat_template(
                    [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
                )
                for p in prompts
            ]
            inputs = [llm.tokenizer.encode(t, add_special_tokens=False) for t in inputs]  # type: ignore[arg-type]
        try:
            outs = llm.generate(inputs, params)
        except InvalidRequest as e:
            print(f"skiff generate: {e}", file=sys.stderr)
            return 2
    for prompt, out in zip(prompts, outs, strict=True):
        if args.json:
            print(
                json.dumps(
                    {
                        "prompt": prompt,
                        "text": out.text,
                        "finish_reason": out.finish_reason,
                        "completion_tokens": len(out.token_ids),
                    },
                    ensure_ascii=False,
                )
            )
        else:
            print(out.text)
    return 0

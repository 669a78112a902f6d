"""`skiff bench offline` (in-process engine throughput) and `skiff bench serve` (load on an OpenAI server)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
from dataclasses import asdict, fields
from typing import Any

from skiff.bench.offline import OfflineWorkload
from skiff.commands.serve import add_engine_arguments, engine_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True)
    off = sub.add_parser("offline", help="throughput of the in-process engine on the seed's workload")
    add_engine_arguments(off)
    w = off.add_argument_group("workload (defaults: the seed's benchmark)")
    for f in fields(OfflineWorkload):
        if isinstance(f.default, bool):  # the default is on: the flag turns it off
            w.add_argument(f"--no-{f.name.replace('_', '-')}", dest=f.name, action="store_false")
        else:
            w.add_argument(
                f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default, **f.metadata
            )
    w.add_argument("--no-warmup", action="store_true")
    w.add_argument("--output-json", default=None)

    srv = sub.add_parser("serve", help="load generator for any OpenAI-compatible server")
    srv.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    srv.add_argument("--model", default=None, help="default: the first model of /v1/models")
    srv.add_argument("--api", default="completions", choices=["completions", "chat"])
    srv.add_argument("--api-key", default=os.environ.get("SKIFF_API_KEY") or os.environ.get("OPENAI_API_KEY"))
    srv.add_argument("--dataset", default="random", choices=["random", "shared-prefix"])
    srv.add_argument("--num-prompts", type=int, default=64)
    srv.add_argument("--random-input-len", type=int, default=256)
    srv.add_argument("--random-output-len", type=int, default=128)
    srv.add_argument(
        "--random-range-ratio", type=float, default=1.0, help="lengths uniform in [ratio*len, len]"
    )
    srv.add_argument("--shared-prefix-groups", type=int, default=4)
    srv.add_argument("--shared-prefix-len", type=int, default=512)
    srv.add_argument("--shared-suffix-len", type=int, default=64)
    srv.add_argument("--prompt-ids", action="store_true", help="send token-id prompts (completions API only)")
    srv.add_argument(
        "--tokenizer", default=None, help="for exact prompt lengths (default: the embedded model's)"
    )
    srv.add_argument(
        "--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); inf: all at once"
    )
    srv.add_argument("--max-concurrency", type=int, default=None)
    srv.add_argument(
        "--num-clients",
        type=int,
        default=1,
        help="client processes sharing the load (each its own event loop)",
    )
    srv.add_argument("--temperature", type=float, default=0.0)
    srv.add_argument("--no-ignore-eos", action="store_true")
    srv.add_argument("--warmup-requests", type=int, default=1)
    srv.add_argument("--seed", type=int, default=0)
    srv.add_argument("--timeout", type=float, default=600.0)
    srv.add_argument("--output-json", default=None)
    srv.add_argument("--plot", default=None, help="write a latency plot (PNG; needs matplotlib)")
    srv.add_argument("--no-progress", action="store_true")


def _write(path: str | None, data: dict[str, Any]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
        print(f"wrote {path}")


def run_offline_cmd(args: argparse.Namespace) -> int:
    from skiff.bench.offline import run_offline

    cfg = engine_config(args)
    kwargs = {k: v for k, v in vars(cfg).items() if k not in ("model", "tokenizer")}
    kwargs.update(model=cfg.model, tokenizer=cfg.tokenizer)
    wl = OfflineWorkload(**{f.name: getattr(args, f.name) for f in fields(OfflineWorkload)})
    res = run_offline(wl, kwargs, warmup=not args.no_warmup)
    print(
        f"{res['output_tokens']} output tokens ({res['input_tokens']} input) in {res['wall_seconds']:.2f} s: "
        f"{res['output_throughput']:.1f} output tok/s, {res['total_throughput']:.1f} total tok/s"
    )
    _write(args.output_json, res)
    return 0


def _load_tokenizer(path: str | None) -> Any | None:
    from skiff.tokenizer import load_tokenizer

    try:
        if path:
            return load_tokenizer(path)
        from skiff.embedded import embedded_model_path

        return load_tokenizer(embedded_model_path())
    except (FileNotFoundError, OSError, ValueError) as e:
        print(f"no tokenizer ({e}): prompts are random words, lengths approximate", file=sys.stderr)
        return None


def run_serve_cmd(args: argparse.Namespace) -> int:
    import httpx

    from skiff.bench import serve_client as sc
    from skiff.bench.load_clients import run_clients, saturation_note
    from skiff.bench.workloads import PromptMaker, random_workload, shared_prefix_workload

    model = args.model
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if model is None:
        try:
            model = httpx.get(args.base_url.rstrip("/") + "/models", headers=headers, timeout=30).json()[
                "data"
            ][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
            print(f"cannot list models at {args.base_url}: {e}; pass --model", file=sys.stderr)
            return 2
    if args.prompt_ids and args.api == "chat":
        print("--prompt-ids needs --api completions", file=sys.stderr)
        return 2
    maker = PromptMaker(_load_tokenizer(args.tokenizer), random.Random(args.seed))
    if args.prompt_ids and maker.tok is None:
        print("--prompt-ids needs a tokenizer", file=sys.stderr)
        return 2
    if args.dataset == "random":
        reqs = random_workload(
            maker,
            args.num_prompts,
            args.random_input_len,
            args.random_output_len,
            args.random_range_ratio,
            args.prompt_ids,
        )
    else:
        reqs = shared_prefix_workload(
            maker,
            args.num_prompts,
            args.shared_prefix_groups,
            args.shared_prefix_len,
            args.shared_suffix_len,
            args.random_output_len,
            args.prompt_ids,
        )
    target = sc.ServeTarget(
        args.base_url, model, args.api, args.api_key, not args.no_ignore_eos, args.temperature, args.timeout
    )
    if args.warmup_requests:
        warm = [
            sc.BenchRequest(r.prompt, r.prompt_len, min(r.max_tokens, 16))
            for r in reqs[: args.warmup_requests]
        ]
        asyncio.run(sc.run_load(target, warm, float("inf"), None, args.seed, progress=False))
    results, duration, clients = run_clients(
        target,
        reqs,
        args.request_rate,
        args.max_concurrency,
        args.seed,
        num_clients=args.num_clients,
        progress=not args.no_progress,
    )
    summary = sc.summarize(results, duration)
    summary["clients"] = [{**asdict(c), "saturated": c.saturated} for c in clients]
    summary["client_saturated"] = any(c.saturated for c in clients)
    print(sc.format_summary(summary))
    note = saturation_note(clients)
    if note:
        print(note, file=sys.stderr)
    config = {k: v for k, v in vars(args).items() if k not in ("api_key", "func")}
    config["model"] = model
    config["request_rate"] = str(args.request_rate)
    _write(args.output_json, sc.result_json(summary, config, results))
    if args.plot and not sc.plot(results, args.plot):
        print("--plot needs matplotlib (pip install 'skiff[plot]')", file=sys.stderr)
    return 0 if summary["completed"] else 1


def run(args: argparse.Namespace) -> int:
    return run_offline_cmd(args) if args.bench == "offline" else run_serve_cmd(args)

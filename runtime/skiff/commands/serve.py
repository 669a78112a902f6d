"""`skiff serve`: an OpenAI-compatible server (the embedded SmolLM2-135M-Instruct when no --model is given)."""

from __future__ import annotations

import argparse
import os

from skiff_contract.tracing import ENDPOINT_HELP

from skiff.config import DTYPE_NAMES, LOAD_FORMATS, QUANTIZATION_NAMES, EngineConfig
from skiff.server.reasoning import REASONING_PARSERS
from skiff.server.tool_calls import TOOL_PARSERS

REQUIRES = ("torch",)  # checked by skiff.cli before the command runs


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Engine flags shared by `serve`, `generate` and `bench offline` (SGLang's names)."""
    d = EngineConfig()
    g = parser.add_argument_group("engine")
    g.add_argument(
        "--model",
        "--model-path",
        dest="model",
        default=None,
        help="HF model directory or .gguf file (default: the embedded SmolLM2-135M-Instruct)",
    )
    g.add_argument("--tokenizer", "--tokenizer-path", dest="tokenizer", default=None)
    g.add_argument("--tp", "--tp-size", dest="tp", type=int, default=d.tp, help="tensor-parallel ranks")
    g.add_argument("--dtype", default=d.dtype, choices=DTYPE_NAMES)
    g.add_argument(
        "--load-format",
        default=d.load_format,
        choices=LOAD_FORMATS,
        help="dummy: random weights for the model's config.json (benchmarks; no weights files needed)",
    )
    g.add_argument("--device", default=d.device, choices=["auto", "cpu", "cuda"])
    g.add_argument(
        "--quantization",
        default=d.quantization,
        choices=QUANTIZATION_NAMES,
        help="auto (default): a GGUF model computes on its own quantized blocks on CPU, others on float "
        "weights; gguf: require that; none: float weights (a GGUF dequantized to fp32); int8: int8 weights "
        "and per-token int8 activations on CPU (measurably less exact)",
    )
    g.add_argument(
        "--kv-cache-dtype",
        default=d.kv_cache_dtype,
        choices=DTYPE_NAMES,
        help="KV cache dtype (auto: the model's; float16 on a GGUF's own blocks, as llama.cpp); float16 on an fp32 "
        "CPU model halves its memory traffic",
    )
    g.add_argument("--max-running-requests", type=int, default=d.max_running_requests)
    g.add_argument("--chunked-prefill-size", type=int, default=d.chunked_prefill_size)
    g.add_argument("--page-size", type=int, default=d.page_size)
    g.add_argument(
        "--mem-fraction", "--mem-fraction-static", dest="mem_fraction", type=float, default=d.mem_fraction
    )
    g.add_argument("--cpu-kv-cache-gb", type=float, default=d.cpu_kv_cache_gb)
    g.add_argument("--max-total-tokens", type=int, default=None, help="KV pool size in tokens")
    g.add_argument("--context-length", type=int, default=None)
    g.add_argument("--attention-backend", default=d.attention_backend)
    g.add_argument(
        "--cuda-graph-max-bs", type=int, default=d.cuda_graph_max_bs, help="0 disables CUDA graphs"
    )
    g.add_argument(
        "--disable-radix-cache", action="store_true", help="use the naive (no prefix sharing) cache"
    )
    g.add_argument("--disable-overlap-schedule", action="store_true")
    g.add_argument(
        "--null-engine",
        action="store_true",
        help="benchmarks: no model runs, each step gives every request its next token at no cost",
    )
    g.add_argument("--schedule-policy", default=d.schedule_policy, choices=["fcfs", "priority"])
    g.add_argument("--num-threads", type=int, default=None, help="CPU threads for torch")
    g.add_argument("--random-seed", dest="seed", type=int, default=d.seed)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model,
        tokenizer=args.tokenizer,
        served_model_name=getattr(args, "served_model_name", None),
        dtype=args.dtype,
        load_format=args.load_format,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        device=args.device,
        tp=args.tp,
        page_size=args.page_size,
        max_running_requests=args.max_running_requests,
        chunked_prefill_size=args.chunked_prefill_size,
        max_total_tokens=args.max_total_tokens,
        mem_fraction=args.mem_fraction,
        cpu_kv_cache_gb=args.cpu_kv_cache_gb,
        context_length=args.context_length,
        cache="naive" if args.disable_radix_cache else "radix",
        schedule_policy=args.schedule_policy,
        attention_backend=args.attention_backend,
        cuda_graph_max_bs=args.cuda_graph_max_bs,
        disable_overlap=args.disable_overlap_schedule
        or os.environ.get("SKIFF_DISABLE_OVERLAP_SCHEDULING") == "1",
        null_engine=args.null_engine,
        num_threads=args.num_threads,
        seed=args.seed,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    g = parser.add_argument_group("server")
    g.add_argument(
        "--served-model-name", default=None, help="the model id clients send (default: from --model)"
    )
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument(
        "--api-key",
        default=os.environ.get("SKIFF_API_KEY"),
        help="require `Authorization: Bearer KEY` on /v1 (default: $SKIFF_API_KEY)",
    )
    g.add_argument(
        "--api-key-file",
        default=os.environ.get("SKIFF_API_KEY_FILE"),
        help="accept every key in FILE (one per line; re-read when it changes, e.g. a mounted Secret "
        "during a rotation); with --api-key, both are accepted (default: $SKIFF_API_KEY_FILE)",
    )
    g.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics on this port only (not on --port), so a network policy can open one alone",
    )
    g.add_argument("--num-tokenizers", type=int, default=1, help="tokenizer worker processes")
    g.add_argument(
        "--api-workers",
        type=int,
        default=1,
        help="HTTP API server processes on the one port (SO_REUSEPORT; /metrics sums them)",
    )
    g.add_argument(
        "--detokenizer-workers", type=int, default=1, help="detokenizer processes (requests dealt out)"
    )
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    g.add_argument(
        "--grace-period", type=float, default=30.0, help="seconds to finish in-flight work on SIGTERM"
    )
    g.add_argument("--max-body-mb", type=float, default=32.0, help="largest accepted request body")
    g.add_argument("--max-n", type=int, default=128, help="largest n x prompts of one request")
    g.add_argument("--otlp-traces-endpoint", default=None, help=ENDPOINT_HELP)
    g.add_argument(
        "--tool-call-parser",
        default="auto",
        choices=["auto", "none", *TOOL_PARSERS],
        help="the chat template's tool-call format (auto: detected from the template)",
    )
    g.add_argument(
        "--reasoning-parser",
        default="auto",
        choices=["auto", "none", *REASONING_PARSERS],
        help="split <think> reasoning into reasoning_content (auto: when the template thinks)",
    )


def run(args: argparse.Namespace) -> int:
    from skiff.server.auth import KeyRing

    try:
        config = engine_config(args)
        for flag in ("num_tokenizers", "api_workers", "detokenizer_workers"):
            if getattr(args, flag) < 1:
                raise ValueError(f"--{flag.replace('_', '-')} must be >= 1")
        if args.metrics_port is not None and not 0 < args.metrics_port < 65536:
            raise ValueError(f"--metrics-port must be a port number, got {args.metrics_port}")
        if args.metrics_port is not None and args.metrics_port == args.port:
            raise ValueError("--metrics-port must differ from --port")
        KeyRing.configured(args.api_key or None, args.api_key_file or None)
    except ValueError as e:
        print(f"skiff serve: {e}")
        return 2
    metrics_dir = None
    if args.api_workers > 1:  # before prometheus_client is imported (skiff_process.workers says why)
        from skiff_process.workers import use_multiprocess_metrics

        metrics_dir = use_multiprocess_metrics()
    from skiff.server.args import ServerArgs
    from skiff.server.launcher import serve

    server = ServerArgs(
        engine=config,
        host=args.host,
        port=args.port,
        api_key=args.api_key or None,
        api_key_file=args.api_key_file or None,
        metrics_port=args.metrics_port,
        num_tokenizers=args.num_tokenizers,
        api_workers=args.api_workers,
        detokenizer_workers=args.detokenizer_workers,
        metrics_dir=metrics_dir,
        log_level=args.log_level,
        grace_period=args.grace_period,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        max_n=args.max_n,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        otlp_traces_endpoint=args.otlp_traces_endpoint,
    )
    return serve(server)

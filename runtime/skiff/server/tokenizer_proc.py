"""Tokenizer worker process: chat templates and encoding, off the API server's event loop.

Several workers may run (--num-tokenizers); each API worker's PUSH socket deals requests out round-robin.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import zmq
from skiff_process.child import setup_child

from skiff.server import protocol as P
from skiff.server.args import ServerArgs
from skiff.server.messages import (
    ChatPrompt,
    Prompt,
    RequestFailed,
    Shutdown,
    TextPrompt,
    TokenIdsPrompt,
    TokenizedRequest,
    TokenizeRequest,
    TokenizerReady,
    ToTokenizer,
)
from skiff.server.reasoning import detect_reasoning_parser, prompt_opens_reasoning
from skiff.server.tool_calls import detect_tool_parser
from skiff.tokenizer import load_tokenizer

log = logging.getLogger("skiff.tokenizer")


class PromptError(ValueError):
    pass


def encode_prompt(tok: Any, prompt: Prompt) -> list[int]:
    match prompt:
        case TokenIdsPrompt(ids=ids):
            vocab = len(tok)
            bad = [i for i in ids if not 0 <= i < vocab]
            if bad:
                raise PromptError(f"prompt token id {bad[0]} is out of range [0, {vocab})")
            return list(ids)
        case TextPrompt(text=text):
            return tok.encode(text, add_special_tokens=True)
        case ChatPrompt(messages=messages, template_kwargs=kwargs):
            if not getattr(tok, "chat_template", None):
                raise PromptError("this model has no chat template: use /v1/completions")
            try:
                text = tok.apply_chat_template(
                    messages, tokenize=False, **{"add_generation_prompt": True, **kwargs}
                )
            except Exception as e:  # jinja's raise_exception (e.g. roles must alternate) and template errors
                raise PromptError(f"the chat template rejected the messages: {e}") from e
            return tok.encode(text, add_special_tokens=False)
    raise PromptError(f"unknown prompt type {type(prompt).__name__}")


def output_formats(tok: Any, tool_parser: str, reasoning_parser: str) -> tuple[str | None, str | None]:
    """The tool-call and reasoning parsers for this chat template ("auto": detected from its text)."""
    template = getattr(tok, "chat_template", None)
    template = template if isinstance(template, str) else None
    tools = detect_tool_parser(template) if tool_parser == "auto" else tool_parser
    reasoning = detect_reasoning_parser(template) if reasoning_parser == "auto" else reasoning_parser
    if reasoning_parser == "auto" and reasoning is not None:
        probe = [{"role": "user", "content": "Hi"}]
        try:
            prompt = tok.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
        except Exception:  # a template that needs more than one user message: keep the detected one
            prompt = ""
        if prompt_opens_reasoning(prompt):
            reasoning = "deepseek-r1"  # the template opens the block: the output starts inside it
    return (None if tools == "none" else tools), (None if reasoning == "none" else reasoning)


def run_tokenizer(args: ServerArgs, endpoints: P.Endpoints, index: int) -> None:
    setup_child(f"tokenizer-{index}", args.log_level)
    tok = load_tokenizer(args.tokenizer_path)
    ctx = zmq.Context()
    pull = P.pull_socket(ctx, endpoints.tokenizer[0], bind=False)
    for addr in endpoints.tokenizer[1:]:  # one pipe per API worker, fair-queued
        pull.connect(addr)
    inbox = P.Inbox(pull, P.Decoder("tokenizer", ToTokenizer))
    to_sched = P.outbox(ctx, endpoints.scheduler)
    to_api = P.ApiOutboxes(ctx, endpoints)
    probe = tok.encode("Hello", add_special_tokens=False) or [0]
    tools, reasoning = output_formats(tok, args.tool_call_parser, args.reasoning_parser)
    to_api.send(TokenizerReady(f"tokenizer-{index}", probe, len(tok), tools, reasoning))
    while True:
        msg = inbox.recv()
        if isinstance(msg, Shutdown):
            return
        assert isinstance(msg, TokenizeRequest)
        try:
            ids = encode_prompt(tok, msg.prompt)
        except PromptError as e:
            for rid in msg.rids:
                to_api.to(msg.owner).send(RequestFailed(rid, 400, str(e)))
            continue
        except Exception as e:  # a tokenizer bug must not take the worker down
            log.exception("tokenizing failed")
            for rid in msg.rids:
                to_api.to(msg.owner).send(RequestFailed(rid, 500, f"tokenizer error: {e}"))
            continue
        done = time.time_ns()
        for rid, sampling in zip(msg.rids, msg.sampling, strict=True):
            to_sched.send(TokenizedRequest(rid, ids, sampling, msg.max_tokens, msg.decode, msg.owner, done))

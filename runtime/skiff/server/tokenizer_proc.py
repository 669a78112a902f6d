"""Tokenizer worker process: chat templates and encoding, off the API server's event loop.

Several workers may run (--num-tokenizers); the API's PUSH socket deals requests out round-robin.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from skiff.server import protocol as P
from skiff.server.args import ServerArgs
from skiff.server.child import setup_child
from skiff.tokenizer import load_tokenizer

log = logging.getLogger("skiff.tokenizer")


class PromptError(ValueError):
    pass


def encode_prompt(tok: Any, msg: dict[str, Any]) -> list[int]:
    kind = msg["kind"]
    if kind == "ids":
        ids = list(msg["prompt"])
        vocab = len(tok)
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise PromptError(f"prompt token id {bad[0]} is out of range [0, {vocab})")
        return ids
    if kind == "text":
        return tok.encode(msg["prompt"], add_special_tokens=True)
    if kind == "chat":
        if not getattr(tok, "chat_template", None):
            raise PromptError("this model has no chat template: use /v1/completions")
        try:
            text = tok.apply_chat_template(
                msg["messages"],
                tokenize=False,
                add_generation_prompt=msg.get("add_generation_prompt", True),
                **(msg.get("template_kwargs") or {}),
            )
        except Exception as e:  # jinja's raise_exception (e.g. roles must alternate) and template errors
            raise PromptError(f"the chat template rejected the messages: {e}") from e
        return tok.encode(text, add_special_tokens=False)
    raise PromptError(f"unknown prompt kind {kind!r}")


def run_tokenizer(args: ServerArgs, endpoints: P.Endpoints, index: int) -> None:
    setup_child(f"tokenizer-{index}", args.log_level)
    tok = load_tokenizer(args.tokenizer_path)
    ctx = zmq.Context()
    inbox = P.pull_socket(ctx, endpoints.tokenizer, bind=False)
    to_sched = P.push_socket(ctx, endpoints.scheduler)
    to_api = P.push_socket(ctx, endpoints.api)
    probe = tok.encode("Hello", add_special_tokens=False) or [0]
    to_api.send(
        P.pack({"t": P.READY, "who": f"tokenizer-{index}", "probe_ids": probe, "vocab_size": len(tok)})
    )
    while True:
        msg = P.unpack(inbox.recv())
        if msg["t"] == P.SHUTDOWN:
            return
        try:
            ids = encode_prompt(tok, msg)
        except PromptError as e:
            for rid in msg["rids"]:
                to_api.send(P.pack({"t": P.ERR, "rid": rid, "status": 400, "message": str(e)}))
            continue
        except Exception as e:  # a tokenizer bug must not take the worker down
            log.exception("tokenizing failed")
            for rid in msg["rids"]:
                to_api.send(
                    P.pack({"t": P.ERR, "rid": rid, "status": 500, "message": f"tokenizer error: {e}"})
                )
            continue
        for rid, params in zip(msg["rids"], msg["params"], strict=True):
            to_sched.send(
                P.pack({"t": P.ADD, "rid": rid, "ids": ids, "params": params, "detok": msg["detok"]})
            )

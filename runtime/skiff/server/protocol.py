"""Messages between the pod's processes: msgpack-encoded dicts over ZeroMQ PUSH/PULL sockets.

Topology (every arrow is one PUSH -> PULL pipe; the PULL side binds):

    API --gen--> tokenizer(s) --add--> scheduler --reg/out--> detokenizer --out--> API
    API --abort/ctl--> scheduler        detokenizer --abort (stop string)--> scheduler
    scheduler/tokenizer/detokenizer --ready/stats/err/ctl_reply--> API

The scheduler sends a request's `reg` (its stop strings and decode options) to the detokenizer on the
same pipe as its outputs, so the detokenizer always knows a request before its first tokens arrive.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq

# message types ("t" field)
GEN = "gen"  # API -> tokenizer: a prompt to tokenize and submit
ADD = "add"  # tokenizer -> scheduler: token ids + sampling params
ABORT = "abort"  # API / detokenizer -> scheduler
REG = "reg"  # scheduler -> detokenizer: per-request decode options
OUT = "out"  # scheduler -> detokenizer (token ids), detokenizer -> API (text)
ERR = "err"  # tokenizer / scheduler -> API: a request rejected before it ran
READY = "ready"  # every child -> API, once, after it has loaded
STATS = "stats"  # scheduler -> API, periodically (the heartbeat)
CTL = "ctl"  # API -> scheduler: control command (integrity check, ...)
CTL_REPLY = "ctl_reply"  # scheduler -> API
SHUTDOWN = "shutdown"  # API -> children


def pack(msg: dict[str, Any]) -> bytes:
    return msgpack.packb(msg, use_bin_type=True)


def unpack(data: bytes) -> dict[str, Any]:
    # strict_map_key=False: top_logprobs maps token ids (ints) to logprobs
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


@dataclass(frozen=True)
class Endpoints:
    """The ipc:// addresses of the pod's PULL sockets, all inside one private directory."""

    root: str

    def _addr(self, name: str) -> str:
        return "ipc://" + os.path.join(self.root, name)

    @property
    def api(self) -> str:
        return self._addr("api")

    @property
    def tokenizer(self) -> str:
        return self._addr("tokenizer")

    @property
    def scheduler(self) -> str:
        return self._addr("scheduler")

    @property
    def detokenizer(self) -> str:
        return self._addr("detokenizer")


def push_socket(ctx: zmq.Context, addr: str, bind: bool = False) -> zmq.Socket:
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.bind(addr) if bind else sock.connect(addr)
    return sock


def pull_socket(ctx: zmq.Context, addr: str, bind: bool = True) -> zmq.Socket:
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.bind(addr) if bind else sock.connect(addr)
    return sock


def drain(sock: zmq.Socket, timeout_ms: int) -> list[dict[str, Any]]:
    """Every message waiting on `sock`, waiting up to `timeout_ms` for the first one."""
    msgs: list[dict[str, Any]] = []
    if timeout_ms and not sock.poll(timeout_ms):
        return msgs
    while True:
        try:
            msgs.append(unpack(sock.recv(zmq.NOBLOCK)))
        except zmq.Again:
            return msgs

"""The transport between the pod's processes: ZeroMQ PUSH/PULL pipes of typed messages (`messages.py`).

Topology (every arrow is one PUSH -> PULL pipe; the PULL side binds):

    API --TokenizeRequest--> tokenizer(s) --TokenizedRequest--> scheduler --StepTokens--> detokenizer
    detokenizer --DetokenizedChunks--> API
    API --AbortRequest, IntegrityCheck, Shutdown--> scheduler    detokenizer --AbortRequest--> scheduler
    scheduler/tokenizer/detokenizer --*Ready, SchedulerStats, RequestFailed, IntegrityReport--> API

The scheduler sends a request's `DecodeRegistration` (its stop strings and decode options) to the
detokenizer on the same pipe as its outputs, so the detokenizer always knows a request before its first
tokens arrive.

Several API workers (`--api-workers`): each binds its own inbox and its own tokenizer pipe (every tokenizer
connects to all of them), and the others send each request's replies to the inbox of the worker that owns
it (`ApiOutboxes.to(owner)`). Several detokenizers (`--detokenizer-workers`): the scheduler deals requests
out to them and sends each step's tokens to the detokenizer of each request.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from skiff.server.messages import Message

log = logging.getLogger("skiff.protocol")
_encoder = msgspec.msgpack.Encoder()


class ProtocolError(ValueError):
    """A frame that is not one of the messages its pipe accepts."""


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


class Decoder:
    """Frames -> messages for one pipe, which accepts the types of one union (e.g. `ToScheduler`)."""

    def __init__(self, pipe: str, accepts: Any) -> None:
        self.pipe = pipe
        self._decoder = msgspec.msgpack.Decoder(accepts)

    def __call__(self, frame: bytes) -> Message:
        try:
            return self._decoder.decode(frame)
        except msgspec.DecodeError as e:  # ValidationError (a wrong or unknown type) is a DecodeError
            raise ProtocolError(f"bad message on the {self.pipe} pipe ({len(frame)} bytes): {e}") from e


@dataclass(frozen=True)
class Endpoints:
    """The ipc:// addresses of the pod's bound sockets, all inside one private directory."""

    api: tuple[str, ...]  # one inbox per API worker
    tokenizer: tuple[str, ...]  # one tokenizer pipe per API worker (its PUSH side binds)
    scheduler: str
    detokenizer: tuple[str, ...]  # one inbox per detokenizer

    @classmethod
    def under(cls, root: str, api_workers: int = 1, detokenizers: int = 1) -> Endpoints:
        def addr(name: str) -> str:
            return "ipc://" + os.path.join(root, name)

        def several(name: str, n: int) -> tuple[str, ...]:
            return (addr(name),) + tuple(addr(f"{name}-{i}") for i in range(1, n))

        return cls(
            several("api", api_workers),
            several("tokenizer", api_workers),
            addr("scheduler"),
            several("detokenizer", detokenizers),
        )


class Outbox:
    """The sending end of a pipe."""

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock

    def send(self, msg: Message) -> None:
        self.sock.send(encode(msg))


class ApiOutboxes:
    """A child's pipes to every API worker: replies to a request's owner, heartbeats and failures to all."""

    def __init__(self, ctx: zmq.Context, endpoints: Endpoints) -> None:
        self.boxes = [outbox(ctx, addr) for addr in endpoints.api]

    def to(self, owner: int) -> Outbox:
        return self.boxes[owner]

    def send(self, msg: Message) -> None:
        """To the first worker: the API process that collects the pod's readiness."""
        self.boxes[0].send(msg)

    def broadcast(self, msg: Message) -> None:
        frame = encode(msg)
        for box in self.boxes:
            box.sock.send(frame)


def _socket(ctx: zmq.Context, kind: int, addr: str, bind: bool) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM if kind == zmq.PUSH else zmq.RCVHWM, 0)  # never drop a message
    sock.bind(addr) if bind else sock.connect(addr)
    return sock


def push_socket(ctx: zmq.Context, addr: str, bind: bool = False) -> zmq.Socket:
    return _socket(ctx, zmq.PUSH, addr, bind)


def pull_socket(ctx: zmq.Context, addr: str, bind: bool = True) -> zmq.Socket:
    return _socket(ctx, zmq.PULL, addr, bind)


def outbox(ctx: zmq.Context, addr: str, bind: bool = False) -> Outbox:
    return Outbox(push_socket(ctx, addr, bind))


class Inbox:
    """The receiving end of a pipe (a blocking socket). A bad frame is logged and dropped."""

    def __init__(self, sock: zmq.Socket, decode: Decoder) -> None:
        self.sock = sock
        self.decode = decode

    def recv(self) -> Message:
        while True:
            msg = self._decoded(self.sock.recv())
            if msg is not None:
                return msg

    def drain(self, timeout_ms: int) -> list[Message]:
        """Every message waiting, waiting up to `timeout_ms` for the first one."""
        msgs: list[Message] = []
        if timeout_ms and not self.sock.poll(timeout_ms):
            return msgs
        while True:
            try:
                frame = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return msgs
            msg = self._decoded(frame)
            if msg is not None:
                msgs.append(msg)

    def _decoded(self, frame: bytes) -> Message | None:
        try:
            return self.decode(frame)
        except ProtocolError:
            log.exception("dropped a message")
            return None

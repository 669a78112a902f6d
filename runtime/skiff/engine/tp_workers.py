"""Tensor-parallel follower processes (ranks 1..tp-1) and the PUB/SUB channel rank 0 drives them with.

Rank 0 binds an XPUB socket and waits until every follower's subscription has arrived, so no plan is
published before all followers listen (PUB/SUB drops messages sent before a subscriber joins).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import socket
from dataclasses import replace

import msgspec
import zmq

from skiff.config import EngineConfig
from skiff.engine.loading import load_runner
from skiff.engine.plan import FollowerMessage, StopFollowers, plan_to_batch

log = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PlanPublisher:
    def __init__(self, num_followers: int) -> None:
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.num_followers = num_followers
        self.encoder = msgspec.msgpack.Encoder()

    def wait_for_followers(self, procs: list[mp.process.BaseProcess], timeout_s: float = 600.0) -> None:
        joined = 0
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        waited = 0.0
        while joined < self.num_followers:
            if any(not p.is_alive() for p in procs):
                raise RuntimeError("a tensor-parallel follower process exited during start-up")
            if poller.poll(500):
                if self.sock.recv()[:1] == b"\x01":
                    joined += 1
            else:
                waited += 0.5
                if waited > timeout_s:
                    raise TimeoutError("tensor-parallel followers did not subscribe in time")

    def publish(self, message: FollowerMessage) -> None:
        self.sock.send(self.encoder.encode(message))

    def close(self) -> None:
        self.sock.close(linger=1000)


def spawn_followers(cfg: EngineConfig, dist_port: int, plan_port: int) -> list[mp.process.BaseProcess]:
    ctx = mp.get_context("spawn")
    procs = []
    for rank in range(1, cfg.tp):
        p = ctx.Process(
            target=follower_main,
            args=(replace(cfg), rank, dist_port, plan_port),
            name=f"skiff-tp{rank}",
            daemon=True,
        )
        p.start()
        procs.append(p)
    return procs


def follower_main(cfg: EngineConfig, rank: int, dist_port: int, plan_port: int) -> None:
    runner = load_runner(cfg, rank, dist_port)
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(f"tcp://127.0.0.1:{plan_port}")
    parent = os.getppid()
    decoder = msgspec.msgpack.Decoder(FollowerMessage)
    while True:
        if not sock.poll(1000):
            if os.getppid() != parent:  # rank 0 died without saying goodbye: do not linger as an orphan
                break
            continue
        plan = decoder.decode(sock.recv())
        if isinstance(plan, StopFollowers):
            break
        runner.forward(plan_to_batch(plan, cfg.page_size, runner.device))
    sock.close(linger=0)

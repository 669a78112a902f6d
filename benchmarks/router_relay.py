"""The router's SSE relay alone (skiff_router.proxy.relay_sse over a scripted upstream): CPU microseconds per
relayed event when each upstream read carries N complete token events. Under many streams a slow reader gets
many events per read, so the cost must not grow with N.

    python benchmarks/router_relay.py [--events 30000] [--per-read 1 4 32 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator

from skiff_router.balance import Endpoint
from skiff_router.proxy import Upstream, relay_sse

EVENT = (
    b"data: "
    + json.dumps(
        {
            "id": "cmpl-0123456789abcdef",
            "object": "text_completion",
            "created": 1733570000,
            "model": "qwen3",
            "choices": [{"index": 0, "text": " token", "logprobs": None, "finish_reason": None}],
        }
    ).encode()
    + b"\n\n"
)


class _Scripted:
    def __init__(self, reads: list[bytes]) -> None:
        self.reads = reads

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        for r in self.reads:
            yield r

    async def aclose(self) -> None:
        pass


async def _one(per_read: int, events: int) -> float:
    reads = [EVENT * per_read] * max(1, events // per_read)
    up = Upstream(response=_Scripted(reads), endpoint=Endpoint("127.0.0.1:1"), attempts=1)  # type: ignore[arg-type]
    t0 = time.process_time()
    sent = 0
    async for chunk in relay_sse(up, False):
        sent += len(chunk)
    seconds = time.process_time() - t0
    assert sent == len(EVENT) * per_read * len(reads)
    return seconds / (per_read * len(reads)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=30000)
    ap.add_argument("--per-read", type=int, nargs="+", default=[1, 4, 32, 300])
    args = ap.parse_args()
    print("| events per upstream read | CPU us per relayed event (best of 3) |\n|---|---|")
    for n in args.per_read:
        best = min(asyncio.run(_one(n, args.events)) for _ in range(3))
        print(f"| {n} | {best:.2f} |")


if __name__ == "__main__":
    main()

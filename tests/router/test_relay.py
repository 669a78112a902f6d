"""The router's SSE relay over a scripted upstream: what reaches the client, byte for byte, and the usage it
notes, however the backend's bytes are cut into reads."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from skiff_router.balance import Endpoint
from skiff_router.proxy import Upstream, relay_sse


class _Response:
    def __init__(self, reads: list[bytes]) -> None:
        self.reads = reads
        self.closed = False

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        for r in self.reads:
            yield r

    async def aclose(self) -> None:
        self.closed = True


def _token(i: int, sep: bytes = b"\n\n") -> bytes:
    body = {"id": "c", "choices": [{"index": 0, "text": f' "choices" {i}', "finish_reason": None}]}
    return b"data: " + json.dumps(body).encode() + sep


USAGE = {"prompt_tokens": 3, "completion_tokens": 40, "total_tokens": 43}
USAGE_ONLY = b"data: " + json.dumps({"id": "c", "choices": [], "usage": USAGE}).encode() + b"\n\n"
DONE = b"data: [DONE]\n\n"


def _relay(reads: list[bytes], strip: bool) -> tuple[bytes, Upstream, _Response]:
    response = _Response(reads)
    up = Upstream(response=response, endpoint=Endpoint("127.0.0.1:1"), attempts=1)  # type: ignore[arg-type]

    async def run() -> bytes:
        return b"".join([chunk async for chunk in relay_sse(up, strip)])

    return asyncio.run(run()), up, response


def _cut(blob: bytes, size: int) -> list[bytes]:
    return [blob[i : i + size] for i in range(0, len(blob), size)]


@pytest.mark.parametrize("size", [1, 7, 64, 4096, 1 << 20])
def test_relay_strips_the_usage_chunk_it_asked_for_and_notes_usage(size: int) -> None:
    tokens = b"".join(_token(i) for i in range(40))
    out, up, response = _relay(_cut(tokens + USAGE_ONLY + DONE, size), strip=True)
    assert out == tokens + DONE
    assert up.usage.reported and up.usage.completion_tokens == 40 and up.usage.prompt_tokens == 3
    assert response.closed


@pytest.mark.parametrize("size", [1, 13, 1 << 20])
def test_relay_forwards_everything_and_counts_chunks_when_the_backend_sends_no_usage(size: int) -> None:
    blob = b"".join(_token(i, b"\r\n\r\n" if i % 3 else b"\n\n") for i in range(300)) + DONE
    out, up, _ = _relay(_cut(blob, size), strip=False)
    assert out == blob
    # one per event: the escaped "choices" inside each event's text is not counted
    assert not up.usage.reported and up.usage.completion_tokens == 300


def test_relay_keeps_the_usage_chunk_the_client_asked_for() -> None:
    blob = _token(0) + USAGE_ONLY + DONE
    out, up, _ = _relay([blob], strip=False)
    assert out == blob and up.usage.completion_tokens == 40


def test_relay_passes_a_trailing_partial_event_on_at_the_end() -> None:
    out, _, _ = _relay([_token(0), b'data: {"unfinished'], strip=False)
    assert out == _token(0) + b'data: {"unfinished'

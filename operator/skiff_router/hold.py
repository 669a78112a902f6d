"""Holding requests for a known model that has no ready endpoint (scaled to zero, or starting).

A held request waits until discovery lists an endpoint, up to `timeout` seconds; at most `cap` requests per
InferenceService wait at once. The first hold of an episode asks the discovery source to scale from zero.
A known model is never answered 404: it is held, or refused with 503 + Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from skiff_router.discovery import Source
from skiff_router.metrics import RouterMetrics
from skiff_router.registry import Pool, Registry

SCALE_REQUEST_EVERY = 10.0  # seconds between repeated scale-from-zero requests for one pool


class HoldRefused(Exception):
    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


class Holder:
    def __init__(self, registry: Registry, source: Source, metrics: RouterMetrics, cap: int, timeout: float):
        self.registry, self.source, self.metrics = registry, source, metrics
        self.cap, self.timeout = cap, timeout
        self.held: dict[tuple[str, str], int] = {}
        self._scale_asked: dict[tuple[str, str], float] = {}
        self._tasks: set[asyncio.Task] = set()

    def held_for(self, model: str) -> int:
        pool = self.registry.lookup(model)
        return self.held.get(pool.key, 0) if pool else 0

    async def wait(self, model: str) -> Pool:
        """A pool of `model` with at least one endpoint; raises HoldRefused over the cap or past the timeout."""
        pool = self._current(model)
        if pool.endpoints:
            return pool
        key = pool.key
        if self.held.get(key, 0) >= self.cap:
            self.metrics.rejected.labels(model=model, reason="hold_cap").inc()
            raise HoldRefused(
                f"model {model!r} has no ready replica and {self.cap} requests are already waiting",
                "hold_cap",
            )
        self.held[key] = self.held.get(key, 0) + 1
        self.metrics.held.labels(model=model).inc()
        try:
            self._ask_scale(pool)
            deadline = time.monotonic() + self.timeout
            while True:
                pool = self._current(model)
                if pool.endpoints:
                    return pool
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.metrics.rejected.labels(model=model, reason="hold_timeout").inc()
                    raise HoldRefused(
                        f"no replica of model {model!r} became ready within {self.timeout:g}s", "hold_timeout"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(pool.ready.wait(), timeout=min(remaining, 1.0))
        finally:
            self.held[key] -= 1
            self.metrics.held.labels(model=model).dec()

    def progress_comment(self, model: str, elapsed: float) -> bytes:
        return (
            f": skiff: waiting for a ready replica of {model} ({elapsed:.0f}s held, "
            f"{self.held_for(model)} requests waiting, scale-up requested)\n\n"
        ).encode()

    def _current(self, model: str) -> Pool:
        pool = self.registry.lookup(model)
        if pool is None:
            raise HoldRefused(f"model {model!r} was removed while the request was held", "model_not_found")
        return pool

    def _ask_scale(self, pool: Pool) -> None:
        now = time.monotonic()
        if now - self._scale_asked.get(pool.key, -SCALE_REQUEST_EVERY) < SCALE_REQUEST_EVERY:
            return
        self._scale_asked[pool.key] = now
        task = asyncio.create_task(self._scale(pool))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _scale(self, pool: Pool) -> None:
        if await self.source.scale_from_zero(pool.spec):
            self.metrics.scale_ups.labels(model=pool.spec.models[0]).inc()

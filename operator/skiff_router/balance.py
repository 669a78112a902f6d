"""Endpoint selection: prefix-aware consistent hashing with bounded load, least requests, round robin.

A balancer only picks; the caller counts in-flight requests per endpoint (`Endpoint.inflight`) and passes
the endpoints it must avoid (ones that already failed this request).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(eq=False)
class Endpoint:
    """One ready backend pod: `address` is "host:port"; `inflight` is maintained by the proxy."""

    address: str
    inflight: int = 0
    routed: int = 0

    @property
    def url(self) -> str:
        return f"http://{self.address}"


def _hash(data: str) -> int:
    return int.from_bytes(hashlib.blake2b(data.encode(), digest_size=8).digest(), "big")


class Balancer:
    name: str = ""

    def pick(self, endpoints: Sequence[Endpoint], key: str, exclude: set[str]) -> Endpoint | None:
        raise NotImplementedError


class LeastRequests(Balancer):
    """Fewest in-flight requests; ties go to the endpoint routed least so far (spreads cold starts)."""

    name = "leastRequests"

    def pick(self, endpoints: Sequence[Endpoint], key: str, exclude: set[str]) -> Endpoint | None:
        live = [e for e in endpoints if e.address not in exclude]
        return min(live, key=lambda e: (e.inflight, e.routed)) if live else None


class RoundRobin(Balancer):
    name = "roundRobin"

    def __init__(self) -> None:
        self._counter = itertools.count()

    def pick(self, endpoints: Sequence[Endpoint], key: str, exclude: set[str]) -> Endpoint | None:
        live = [e for e in endpoints if e.address not in exclude]
        return live[next(self._counter) % len(live)] if live else None


@dataclass
class _Ring:
    members: tuple[str, ...] = ()
    points: list[int] = field(default_factory=list)
    owners: list[str] = field(default_factory=list)


class PrefixHash(Balancer):
    """Consistent hashing with bounded loads (CHWBL) keyed by the prompt's first characters.

    Requests sharing a prefix land on the same endpoint (whose radix cache holds it) unless that endpoint
    already has more than `load_factor` times the average in-flight load; then the walk continues clockwise
    around the ring, so the overflow also lands on a stable second choice. With no key (empty prompt) the
    choice is least requests.
    """

    name = "prefixHash"

    def __init__(self, load_factor: float = 1.25, vnodes: int = 64) -> None:
        if load_factor < 1.0:
            raise ValueError("load_factor must be >= 1")
        self.load_factor = load_factor
        self.vnodes = vnodes
        self._ring = _Ring()
        self._fallback = LeastRequests()

    def _ring_for(self, addresses: tuple[str, ...]) -> _Ring:
        if self._ring.members != addresses:
            pairs = sorted((_hash(f"{a}#{i}"), a) for a in addresses for i in range(self.vnodes))
            self._ring = _Ring(addresses, [p for p, _ in pairs], [a for _, a in pairs])
        return self._ring

    def pick(self, endpoints: Sequence[Endpoint], key: str, exclude: set[str]) -> Endpoint | None:
        live = {e.address: e for e in endpoints if e.address not in exclude}
        if not live or not key:
            return self._fallback.pick(endpoints, key, exclude)
        ring = self._ring_for(tuple(sorted(live)))
        total = sum(e.inflight for e in live.values())
        bound = max(1, math.ceil(self.load_factor * (total + 1) / len(live)))
        start = bisect.bisect(ring.points, _hash(key)) % len(ring.points)
        seen: set[str] = set()
        for i in range(len(ring.points)):
            address = ring.owners[(start + i) % len(ring.points)]
            if address in seen:
                continue
            seen.add(address)
            if live[address].inflight + 1 <= bound:
                return live[address]
            if len(seen) == len(live):
                break
        return self._fallback.pick(list(live.values()), key, set())


BALANCERS: dict[str, Callable[[], Balancer]] = {
    PrefixHash.name: PrefixHash,
    LeastRequests.name: LeastRequests,
    RoundRobin.name: RoundRobin,
}


def make_balancer(strategy: str) -> Balancer:
    try:
        return BALANCERS[strategy]()
    except KeyError:
        raise ValueError(
            f"unknown routing strategy {strategy!r}; expected one of {sorted(BALANCERS)}"
        ) from None


def prefix_key(body: dict, prefix_chars: int) -> str:
    """The routing key of an OpenAI request: the first `prefix_chars` characters of its prompt text."""
    if "messages" in body:
        parts = []
        for m in body.get("messages") or []:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):  # content parts: keep the text ones
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            parts.append(f"{m.get('role', '') if isinstance(m, dict) else ''}:{content or ''}\n")
        text = "".join(parts)
    else:
        prompt = body.get("prompt", "")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch: its first prompt
        if isinstance(prompt, list):  # token ids
            text = ",".join(map(str, prompt))
        else:
            text = prompt if isinstance(prompt, str) else ""
    return text[:prefix_chars]

"""What the router knows: InferenceService pools, the models they serve, and their ready endpoints.

Discovery sources produce `PoolSpec`s (plain descriptions); `Registry.update` merges them into live `Pool`s,
keeping each endpoint's in-flight count and each pool's balancer (its ring, its round-robin position) across
updates, and wakes requests held for a pool that just got endpoints.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from skiff_router.balance import Balancer, Endpoint, make_balancer

EJECT_SECONDS = 5.0  # an endpoint that refused a connection is skipped this long (or until rediscovered)


@dataclass(frozen=True)
class PoolSpec:
    name: str
    namespace: str
    models: tuple[str, ...]
    addresses: tuple[str, ...] = ()
    strategy: str = "prefixHash"
    prefix_chars: int = 256
    replicas: int | None = None  # spec.replicas of the InferenceService; 0 = scaled to zero
    # spec.apiKeySecretRef: the pods require this key. The router sends it upstream, requires a client key for
    # these models, and accepts the pod key itself as one (named `pod_key_name`, no quota).
    upstream_key: str | None = None
    # Keys the router sends upstream in turn, moving to the next on a 401: the user's key(s) or the
    # operator's internal key (current first, then the previous one during a rotation). Only
    # `upstream_key` is also a client key; an internal key never is.
    upstream_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.upstream_key is not None and self.upstream_key not in self.upstream_keys:
            object.__setattr__(self, "upstream_keys", (self.upstream_key, *self.upstream_keys))

    @property
    def pod_key_name(self) -> str:
        return f"{self.namespace}/{self.name}:pod-key"


@dataclass(eq=False)
class Pool:
    spec: PoolSpec
    balancer: Balancer
    endpoints: list[Endpoint] = field(default_factory=list)
    ejected: dict[str, float] = field(default_factory=dict)  # address -> monotonic time it may return
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def key(self) -> tuple[str, str]:
        return self.spec.namespace, self.spec.name

    def usable(self) -> list[Endpoint]:
        now = time.monotonic()
        ok = [e for e in self.endpoints if self.ejected.get(e.address, 0.0) <= now]
        return ok or list(self.endpoints)  # all ejected: try them anyway rather than hold forever

    def eject(self, address: str) -> None:
        self.ejected[address] = time.monotonic() + EJECT_SECONDS

    def pick(self, routing_key: str, exclude: set[str]) -> Endpoint | None:
        return self.balancer.pick(self.usable(), routing_key, exclude)


class Registry:
    def __init__(self) -> None:
        self.pools: dict[tuple[str, str], Pool] = {}
        self.by_model: dict[str, Pool] = {}
        self.version = 0

    def models(self) -> list[str]:
        return sorted(self.by_model)

    def lookup(self, model: str) -> Pool | None:
        return self.by_model.get(model)

    def update(self, specs: list[PoolSpec]) -> None:
        pools: dict[tuple[str, str], Pool] = {}
        for spec in specs:
            old = self.pools.get((spec.namespace, spec.name))
            if old is None or old.spec.strategy != spec.strategy:
                pool = Pool(spec, make_balancer(spec.strategy))
                if old is not None:
                    pool.ready = old.ready
            else:
                pool = old
                pool.spec = spec
            known = {e.address: e for e in (old.endpoints if old else [])}
            pool.endpoints = [known.get(a) or Endpoint(a) for a in dict.fromkeys(spec.addresses)]
            # a rediscovered endpoint (pod restarted) gets a fresh chance
            pool.ejected = {a: t for a, t in pool.ejected.items() if a in known}
            if pool.endpoints:
                pool.ready.set()
            else:
                pool.ready.clear()
            pools[pool.key] = pool
        for key, old in self.pools.items():  # a removed pool releases its held requests (they get 404)
            if key not in pools:
                old.ready.set()
        by_model: dict[str, Pool] = {}
        for pool in sorted(pools.values(), key=lambda p: p.key):
            for model in pool.spec.models:
                by_model.setdefault(model, pool)
        self.pools, self.by_model = pools, by_model
        self.version += 1

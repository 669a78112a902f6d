"""Discovery sources: a static file (tests, single-host setups) and the Kubernetes API.

Both feed the same two things: `PoolSpec`s into the `Registry` and `ApiKey`s into the `KeyStore`. Both also
answer `scale_from_zero(pool)`, called when a request arrives for a known model that has no ready endpoint.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Protocol

import yaml

from skiff_router.keys import ApiKey, KeyStore
from skiff_router.registry import PoolSpec, Registry

log = logging.getLogger("skiff_router")


class Source(Protocol):
    interval: float  # seconds between refreshes

    async def refresh(self, registry: Registry, keys: KeyStore) -> None: ...

    async def scale_from_zero(self, spec: PoolSpec) -> bool: ...  # True when a scale-up was requested


def _models_field(value: Any) -> str:
    return ",".join(value) if isinstance(value, list) else str(value if value is not None else "*")


def pool_from_dict(d: dict) -> PoolSpec:
    name = d["name"]
    return PoolSpec(
        name=name,
        namespace=d.get("namespace", "default"),
        models=tuple(d.get("models") or [name]),
        addresses=tuple(d.get("endpoints") or ()),
        strategy=d.get("strategy", "prefixHash"),
        prefix_chars=int(d.get("prefixChars", 256)),
        replicas=d.get("replicas"),
        upstream_key=d.get("apiKey"),
        upstream_keys=tuple(d.get("internalKeys") or ()),
    )


def pod_keys(specs: list[PoolSpec]) -> list[ApiKey]:
    """The implicit client keys: each pool's own pod key, valid for that pool's models only."""
    return [ApiKey(s.pod_key_name, s.upstream_key, frozenset()) for s in specs if s.upstream_key]


class StaticSource:
    """A YAML/JSON file with `services:` (name, namespace, models, endpoints, strategy, prefixChars,
    replicas, apiKey: the key the backends require, also a client key; internalKeys: keys the router sends
    the backends in turn, never a client key) and `apiKeys:` (name, key, models, rpm, tpm); re-read
    whenever it changes."""

    def __init__(self, path: str | os.PathLike, interval: float = 0.25) -> None:
        self.path = Path(path)
        self.interval = interval
        self._stamp: tuple[int, int] | None = None
        self.scale_requests: list[str] = []

    async def refresh(self, registry: Registry, keys: KeyStore) -> None:
        st = self.path.stat()
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        doc = yaml.safe_load(self.path.read_text()) or {}
        specs = [pool_from_dict(s) for s in doc.get("services") or []]
        registry.update(specs)
        keys.set_keys(
            pod_keys(specs)
            + [
                ApiKey.from_fields(
                    k["name"],
                    {f: _models_field(v) if f == "models" else str(v) for f, v in k.items() if v is not None},
                )
                for k in doc.get("apiKeys") or []
            ]
        )
        self._stamp = stamp

    async def scale_from_zero(self, spec: PoolSpec) -> bool:
        # nothing to scale here; whoever owns the file starts a backend and lists it
        self.scale_requests.append(spec.name)
        return True

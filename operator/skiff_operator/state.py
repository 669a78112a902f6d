"""What the operator's kopf handlers share: the resource they watch, the API connection and the settings.

A leaf, so that the core handlers (handlers.py) and the autoscaling handlers both import it."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from skiff_contract import GROUP, PLURAL, VERSION

from .kube import Cluster, load_config
from .render import OperatorSettings

ISVC = (GROUP, VERSION, PLURAL)  # the kopf resource selector of InferenceServices


@dataclass
class State:
    settings: OperatorSettings = field(default_factory=OperatorSettings)
    cluster: Cluster | None = None
    errors: dict[tuple[str, str], str] = field(default_factory=dict)  # last reconcile failure per object
    desired_hashes: dict[tuple[str, str], str] = field(default_factory=dict)  # template hash last rendered
    rotations: dict[tuple[str, str], str] = field(default_factory=dict)  # rotate-annotation value applied
    rotation_timers: dict[tuple[str, str], threading.Timer] = field(default_factory=dict)  # deferred ones
    _locks: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def lock(self, key: tuple[str, str]) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def api(self) -> Cluster:
        with self._guard:  # handler threads share one connection and one discovery cache
            if self.cluster is None:
                load_config()
                self.cluster = Cluster()
            return self.cluster


STATE = State()

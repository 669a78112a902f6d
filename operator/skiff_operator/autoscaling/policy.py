"""The autoscaling decision: metric history -> desired replicas, with the reason. Pure; no I/O, no clock.

Per sample the recommendation is ceil(load / targetPerReplica), where load is the metric summed over ready
pods (plus the requests the router holds). Then, like the HPA's behavior field:
- scale up to the *lowest* recommendation of the scale-up window (a burst shorter than the window is
  ignored), scale down to the *highest* of the scale-down window (a dip shorter than it is ignored);
- a scale-down waits until the history covers the whole window (a new leader with no history never scales
  down) and until every current replica is ready (a starting pod's load is not visible yet);
- each decision moves at most maxScaleUpStep / maxScaleDownStep replicas;
- with minReplicas 0, the floor is 1 until there has been no work at all (running, queued or held; not
  just a zero metric) for idleToZeroSeconds (history covering it); from zero, any load (a held request)
  scales up at once, without the scale-up window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Policy:
    min_replicas: int = 1
    max_replicas: int = 4
    target_per_replica: float = 4.0
    scale_up_window: float = 0.0
    scale_down_window: float = 300.0
    max_up_step: int = 4
    max_down_step: int = 1
    idle_to_zero: float = 600.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError("need 0 <= minReplicas <= maxReplicas and maxReplicas >= 1")
        if self.target_per_replica <= 0 or self.max_up_step < 1 or self.max_down_step < 1:
            raise ValueError("targetPerReplica must be > 0 and the maximum steps >= 1")

    @classmethod
    def from_spec(cls, autoscaling: dict[str, Any]) -> Policy:
        a = autoscaling
        return cls(
            min_replicas=int(a.get("minReplicas", 1)),
            max_replicas=int(a.get("maxReplicas", 4)),
            target_per_replica=float(a.get("targetPerReplica", 4)),
            scale_up_window=float(a.get("scaleUpStabilizationSeconds", 0)),
            scale_down_window=float(a.get("scaleDownStabilizationSeconds", 300)),
            max_up_step=int(a.get("maxScaleUpStep", 4)),
            max_down_step=int(a.get("maxScaleDownStep", 1)),
            idle_to_zero=float(a.get("idleToZeroSeconds", 600)),
        )

    @property
    def horizon(self) -> float:
        """How much history decisions look at (older samples can be dropped)."""
        return max(self.scale_up_window, self.scale_down_window, self.idle_to_zero)


@dataclass(frozen=True)
class Sample:
    time: float  # seconds, any monotonic origin
    load: float  # the metric summed over ready pods, plus requests held at the router
    ready: int  # ready replicas when sampled
    active: float | None = None  # any work at all (running + queued + held); None: same as load

    @property
    def idle(self) -> bool:
        return (self.load if self.active is None else self.active) <= 0


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str  # CamelCase, for status and events
    message: str

    def changed(self, current: int) -> bool:
        return self.replicas != current


def recommend(policy: Policy, load: float) -> int:
    return math.ceil(max(0.0, load) / policy.target_per_replica - 1e-9)


def _window(history: Sequence[Sample], now: float, seconds: float) -> list[Sample]:
    recent = [s for s in history if s.time >= now - seconds]
    return recent or list(history[-1:])


def _covers(history: Sequence[Sample], now: float, seconds: float) -> bool:
    return bool(history) and history[0].time <= now - seconds


def decide(policy: Policy, history: Sequence[Sample], current: int, now: float) -> Decision:
    """Desired replicas given samples (oldest first, all at or before `now`) and the current replica count."""
    p = policy
    if current < p.min_replicas:
        return Decision(
            p.min_replicas, "BelowMinimum", f"{current} replicas is below minReplicas {p.min_replicas}"
        )
    if current > p.max_replicas:
        return Decision(
            p.max_replicas, "AboveMaximum", f"{current} replicas is above maxReplicas {p.max_replicas}"
        )
    if not history:
        return Decision(current, "NoMetrics", "no metric samples yet")
    latest = history[-1]
    want = recommend(p, latest.load)
    if current == 0:
        if latest.load <= 0:
            return Decision(0, "Idle", "scaled to zero; no load")
        target = min(p.max_replicas, max(1, p.min_replicas, want), p.max_up_step)
        return Decision(target, "ScaleFromZero", f"load {latest.load:g} at zero replicas")
    floor = max(p.min_replicas, 1)
    if (
        p.min_replicas == 0
        and _covers(history, now, p.idle_to_zero)
        and all(s.idle for s in history if s.time >= now - p.idle_to_zero)
    ):
        floor = 0
    if want > current:
        up = min(recommend(p, s.load) for s in _window(history, now, p.scale_up_window))
        if up <= current:
            return Decision(
                current,
                "ScaleUpStabilizing",
                f"load {latest.load:g} wants {want} but not for {p.scale_up_window:g}s yet",
            )
        target = min(up, current + p.max_up_step, p.max_replicas)
        if target == current:
            return Decision(
                current, "AtMaximum", f"load {latest.load:g} wants {want}; maxReplicas is {p.max_replicas}"
            )
        return Decision(
            target, "ScaleUp", f"load {latest.load:g} over target {p.target_per_replica:g}/replica"
        )
    down = max(max(recommend(p, s.load) for s in _window(history, now, p.scale_down_window)), floor)
    if down >= current:
        if max(want, floor) >= current:
            return Decision(current, "Steady", f"load {latest.load:g} fits {current} replicas")
        return Decision(
            current,
            "ScaleDownStabilizing",
            f"load {latest.load:g} wants {max(want, floor)}; the last {p.scale_down_window:g}s wanted {down}",
        )
    if not _covers(history, now, p.scale_down_window):
        return Decision(
            current,
            "ScaleDownStabilizing",
            f"load {latest.load:g} wants {down}; history is shorter than {p.scale_down_window:g}s",
        )
    if latest.ready < current:
        return Decision(
            current, "WaitingForReady", f"{latest.ready}/{current} replicas ready; not scaling down"
        )
    target = max(down, current - p.max_down_step, p.min_replicas)
    if target == 0:
        return Decision(0, "IdleToZero", f"no load for {p.idle_to_zero:g}s")
    return Decision(target, "ScaleDown", f"load {latest.load:g} fits {down} replicas")

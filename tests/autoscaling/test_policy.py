"""Table-driven tests of the pure decision function: ramps, bursts, flapping, zero, bounds."""

from __future__ import annotations

from dataclasses import replace

import pytest
from skiff_operator.autoscaling.policy import Decision, Policy, Sample, decide, recommend


def run(policy: Policy, loads: list[float], start: int, every: float = 15.0, ready_lag: int = 0) -> list[int]:
    """Feed one sample per tick and apply each decision; the replica count after each tick.

    `ready_lag`: ticks a new replica takes to become ready (its load is invisible meanwhile)."""
    history: list[Sample] = []
    replicas, trace, ready_at = start, [], [0.0] * start
    for i, load in enumerate(loads):
        now = i * every
        ready = sum(1 for t in ready_at if t <= now)
        history.append(Sample(now, load, ready))
        d = decide(policy, history, replicas, now)
        if d.replicas > replicas:
            ready_at += [now + ready_lag * every] * (d.replicas - replicas)
        else:
            ready_at = ready_at[: d.replicas]
        replicas = d.replicas
        trace.append(replicas)
    return trace


# Policy(min, max, target per replica, up window, down window, max up step, max down step, idle to zero)
P = Policy(1, 8, 4, 0, 60, 2, 1, 120)
Z = Policy(0, 4, 4, 0, 30, 4, 4, 60)

CASES = [
    # name, policy, loads per 15s tick, start replicas, expected replicas after each tick
    ("ramp up is limited by the step", P, [4, 8, 16, 24, 32, 32], 1, [1, 2, 4, 6, 8, 8]),
    ("never above maxReplicas", P, [400, 400, 400, 400], 1, [3, 5, 7, 8]),
    (
        "ramp down waits for the window, one step at a time",
        P,
        [16] + [0] * 9,
        4,
        [4, 4, 4, 4, 4, 3, 2, 1, 1, 1],
    ),
    ("a short dip inside the down window is ignored", P, [16, 16, 16, 16, 16, 0, 0, 16, 16, 16], 4, [4] * 10),
    ("flapping load does not flap replicas", P, [16, 4, 16, 4, 16, 4, 16, 4, 16, 4], 4, [4] * 10),
    (
        "never below minReplicas (down once the 60s window is covered)",
        P,
        [0] * 8,
        2,
        [2, 2, 2, 2, 1, 1, 1, 1],
    ),
    (
        "scale from zero on a held request, then idle back to zero",
        Z,
        [0, 0, 1, 1, 0, 0, 0, 0, 0, 0],
        0,
        [0, 0, 1, 1, 1, 1, 1, 1, 0, 0],
    ),
    ("from zero, a big burst goes straight to the bound", Z, [100, 100], 0, [4, 4]),
    ("one request every so often keeps one replica", Z, [1, 0, 0, 1, 0, 0, 1, 0, 0, 1], 0, [1] * 10),
]


@pytest.mark.parametrize("name,policy,loads,start,expected", CASES, ids=[c[0] for c in CASES])
def test_decision_table(name, policy, loads, start, expected):
    assert run(policy, loads, start) == expected


def test_scale_up_window_ignores_a_short_burst_and_follows_a_sustained_one():
    p = replace(P, scale_up_window=30, max_up_step=8, idle_to_zero=0)
    assert run(p, [4, 32, 4, 4, 4], 1) == [1, 1, 1, 1, 1]  # one 15s spike inside a 30s window
    assert run(p, [4, 32, 32, 32, 32], 1) == [1, 1, 1, 8, 8]  # 30s of sustained load


def test_scale_down_waits_while_new_replicas_are_not_ready():
    # load drops while two added replicas are still starting: no scale-down until they are ready
    p = replace(P, scale_down_window=0, max_up_step=4, max_down_step=4, idle_to_zero=0)
    assert run(p, [12, 0, 0, 0, 0], 1, ready_lag=3) == [3, 3, 3, 1, 1]


def test_new_leader_without_history_never_scales_down_at_once():
    d = decide(P, [Sample(1000.0, 0.0, 4)], current=4, now=1000.0)
    assert d == Decision(4, "ScaleDownStabilizing", d.message)


@pytest.mark.parametrize("current,reason,replicas", [(0, "BelowMinimum", 1), (12, "AboveMaximum", 8)])
def test_out_of_bounds_replicas_are_clamped_first(current, reason, replicas):
    d = decide(P, [Sample(0.0, 4.0, current)], current=current, now=0.0)
    assert (d.replicas, d.reason) == (replicas, reason)


def test_reasons_and_no_metrics():
    assert decide(P, [], 3, 0.0).reason == "NoMetrics"
    assert decide(P, [Sample(0, 40, 1)], 1, 0).reason == "ScaleUp"
    assert decide(P, [Sample(0, 400, 8)], 8, 0).reason == "AtMaximum"
    assert decide(Z, [Sample(0, 2, 0)], 0, 0).reason == "ScaleFromZero"
    idle = [Sample(t, 0, 1) for t in range(0, 75, 15)]
    assert decide(Z, idle, 1, 60).reason == "IdleToZero"
    assert decide(Z, [Sample(0, 0, 0)], 0, 0) == Decision(0, "Idle", "scaled to zero; no load")


def test_kv_usage_fractions_and_recommendation():
    p = Policy(target_per_replica=0.7, max_replicas=10)
    assert recommend(p, 0.0) == 0 and recommend(p, 0.7) == 1 and recommend(p, 1.5) == 3
    assert recommend(P, 8.0) == 2 and recommend(P, 8.01) == 3


@pytest.mark.parametrize(
    "bad",
    [
        {"minReplicas": 3, "maxReplicas": 2},
        {"targetPerReplica": 0},
        {"maxScaleUpStep": 0},
        {"maxReplicas": 0, "minReplicas": 0},
    ],
)
def test_invalid_policies_are_rejected(bad):
    with pytest.raises(ValueError):
        Policy.from_spec(bad)


def test_from_spec_reads_the_crd_fields():
    p = Policy.from_spec(
        {
            "minReplicas": 0,
            "maxReplicas": 3,
            "targetPerReplica": 2,
            "scaleUpStabilizationSeconds": 5,
            "scaleDownStabilizationSeconds": 50,
            "maxScaleUpStep": 2,
            "maxScaleDownStep": 3,
            "idleToZeroSeconds": 90,
        }
    )
    assert p == Policy(0, 3, 2.0, 5.0, 50.0, 2, 3, 90.0) and p.horizon == 90.0


def test_running_work_blocks_idle_to_zero_even_when_the_metric_is_zero():
    # metric `queue` is 0 throughout, but a long request is running: never to zero while it runs
    busy = [Sample(t, 0.0, 1, active=1.0) for t in range(0, 150, 15)]
    assert decide(Z, busy, 1, 135).replicas == 1
    done = busy + [Sample(t, 0.0, 1, active=0.0) for t in range(150, 225, 15)]
    assert decide(Z, done, 1, 210).reason == "IdleToZero"

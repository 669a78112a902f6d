"""The pure status function: conditions, observedGeneration, phase and events from observed children."""

from __future__ import annotations

from op_helpers import isvc
from skiff_operator.render import LABEL_HASH, OperatorSettings, deployment
from skiff_operator.spec import parse_spec
from skiff_operator.status import Observed, compute_status

NOW, LATER = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def desired(body: dict) -> dict:
    return deployment(body, parse_spec(body["spec"]), OperatorSettings())


def observed_dep(
    body: dict, ready: int, updated: int | None = None, total: int | None = None, synced: bool = True
) -> dict:
    dep = desired(body)
    dep["metadata"]["generation"] = 3
    want = dep["spec"].get("replicas", 1)
    dep["status"] = {
        "observedGeneration": 3 if synced else 2,
        "replicas": want if total is None else total,
        "readyReplicas": ready,
        "updatedReplicas": want if updated is None else updated,
    }
    return dep


def pod(
    digest: str, ready: bool, name: str = "p", init: dict | None = None, waiting: dict | None = None
) -> dict:
    status: dict = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if init is not None:
        status["initContainerStatuses"] = [{"name": "model-download", **init}]
    if ready:
        status["containerStatuses"] = [{"name": "server", "state": {"running": {}}}]
    if waiting is not None:
        status["containerStatuses"] = [
            {
                "name": "server",
                "state": {"waiting": waiting},
                "lastState": {"terminated": {"exitCode": 1, "message": "CUDA OOM"}},
            }
        ]
    return {"metadata": {"name": name, "labels": {LABEL_HASH: digest}}, "status": status}


def conds(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status["conditions"]}


def run(body: dict, dep: dict | None, pods: list[dict], error: str | None = None, now: str = NOW):
    digest = desired(body)["metadata"]["annotations"][LABEL_HASH]
    return compute_status(body, Observed(dep, pods, digest, error), now)


def test_no_deployment_yet() -> None:
    status, events = run(isvc(), None, [])
    c = conds(status)
    assert c["Ready"]["status"] == "False" and c["Ready"]["reason"] == "DeploymentMissing"
    assert c["Degraded"]["status"] == "False" and status["phase"] == "Pending"
    assert (
        status["observedGeneration"] == 1
        and status["selector"] == "skiff.dev/inferenceservice=demo,skiff.dev/role=main"
    )
    assert status["url"] == "http://demo.ml.svc.cluster.local/v1" and status["servedModel"] == "demo"
    assert [(e.type, e.reason) for e in events] == [("Normal", "ModelReady")]  # a normal start: no Warning


def test_ready_only_with_current_generation_pods() -> None:
    body = isvc({"replicas": 2}, generation=4)
    digest = desired(body)["metadata"]["annotations"][LABEL_HASH]
    dep = observed_dep(body, ready=2)
    status, _ = run(body, dep, [pod(digest, True, "a"), pod(digest, True, "b")])
    c = conds(status)
    assert c["Ready"]["status"] == "True" and c["Ready"]["observedGeneration"] == 4
    assert c["Available"]["reason"] == "AllReplicasReady" and c["Progressing"]["status"] == "False"
    assert status["phase"] == "Ready" and status["readyReplicas"] == 2 and status["desiredReplicas"] == 2
    assert c["Ready"]["message"] == "2 replicas ready"

    old = [pod("old-template", True, "a"), pod("old-template", True, "b")]  # ready, but an older spec
    status, _ = run(body, observed_dep(body, ready=2, updated=0, total=3), old)
    c = conds(status)
    # still serving on the old template: Ready, not Available, Progressing
    assert c["Ready"]["status"] == "True" and c["Available"]["status"] == "False"
    assert c["Progressing"]["status"] == "True" and status["phase"] == "Updating"


def test_a_scale_is_no_rollout_and_keeps_ready() -> None:
    """1 -> 3 while one pod serves: Ready stays True (no Warning), Progressing says Scaling; the Deployment's
    generation moving ahead of its observedGeneration (what a scale does) is no RolloutPending."""
    body = isvc({"replicas": 1})
    digest = desired(body)["metadata"]["annotations"][LABEL_HASH]
    serving, _ = run(body, observed_dep(body, ready=1), [pod(digest, True, "a")])
    assert conds(serving)["Ready"]["message"] == "1 replica ready"
    body = isvc({"replicas": 3}, generation=2, status=serving)
    dep = observed_dep(body, ready=1, synced=False)
    pods = [pod(digest, True, "a"), pod(digest, False, "b"), pod(digest, False, "c")]
    status, events = run(body, dep, pods, now=LATER)
    c = conds(status)
    assert c["Ready"]["status"] == "True" and c["Ready"]["lastTransitionTime"] == NOW
    assert c["Progressing"]["reason"] == "Scaling" and c["Available"]["message"].startswith("1/3 replicas")
    assert [(e.type, e.reason) for e in events] == [("Normal", "Scaling")]
    assert status["desiredReplicas"] == 3 and status["phase"] == "Updating"


def pod_condition(name: str, **cond: str) -> dict:
    p = pod("x", False, name)
    p["status"]["conditions"].append(cond)
    return p


def test_child_failures_surface_in_degraded_with_their_cause() -> None:
    body = isvc()
    digest = desired(body)["metadata"]["annotations"][LABEL_HASH]
    dep = observed_dep(body, ready=0)
    failure = 'pods "demo-1" is forbidden: no PriorityClass with name urgent was found'
    dep["status"]["conditions"] = [
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": failure}
    ]
    status, events = run(body, dep, [])
    c = conds(status)
    assert (c["Degraded"]["status"], c["Degraded"]["reason"]) == ("True", "ReplicaFailure")
    assert "no PriorityClass with name urgent" in c["Degraded"]["message"]
    assert c["Ready"]["status"] == "False" and status["phase"] == "Degraded"
    assert ("Warning", "ReplicaFailure") in [(e.type, e.reason) for e in events]

    def degraded(p: dict) -> tuple[str, str]:
        p["metadata"]["labels"] = {LABEL_HASH: digest}
        d = conds(run(body, observed_dep(body, ready=0), [p])[0])["Degraded"]
        return d["reason"], d["message"]

    gpus = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    unschedulable = pod_condition(
        "g", type="PodScheduled", status="False", reason="Unschedulable", message=gpus
    )
    assert degraded(unschedulable) == ("Unschedulable", f"g: {gpus}")
    unbound = "0/1 nodes are available: 1 pod has unbound immediate PersistentVolumeClaims."
    claim = pod_condition("v", type="PodScheduled", status="False", reason="Unschedulable", message=unbound)
    assert degraded(claim) == ("VolumeNotBound", f"v: {unbound}")
    pull = pod("x", False, "i")
    pull["status"]["containerStatuses"] = [
        {"name": "server", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}
    ]
    assert degraded(pull) == ("ImagePullFailed", "i: server: ImagePullBackOff no such image")


def test_model_failure_degrades_with_the_download_message_and_recovers() -> None:
    body = isvc({"model": {"source": "file:///models/missing"}})
    digest = desired(body)["metadata"]["annotations"][LABEL_HASH]
    failed = pod(
        digest,
        False,
        init={
            "state": {
                "terminated": {
                    "exitCode": 1,
                    "message": "skiff download: error: model not found: /models/missing does not exist",
                }
            }
        },
    )
    status, events = run(body, observed_dep(body, ready=0), [failed])
    c = conds(status)
    assert c["ModelReady"]["status"] == "False" and c["Degraded"]["status"] == "True"
    assert c["Degraded"]["reason"] == "ModelUnavailable"
    assert "model not found: /models/missing" in c["Degraded"]["message"]
    assert c["Ready"]["reason"] == "ModelUnavailable" and status["phase"] == "Degraded"
    assert any(e.type == "Warning" and e.reason == "ModelUnavailable" for e in events)

    body["status"] = status
    ok = pod(digest, True, init={"state": {"terminated": {"exitCode": 0}}})
    status2, events2 = run(body, observed_dep(body, ready=1), [ok], now=LATER)
    c2 = conds(status2)
    assert c2["Ready"]["status"] == "True" and c2["Degraded"]["status"] == "False"
    assert c2["Degraded"]["lastTransitionTime"] == LATER
    assert {e.reason for e in events2} >= {"Recovered", "Ready", "ModelReady"}


def test_unchanged_conditions_keep_their_transition_time() -> None:
    body = isvc()
    first, _ = run(body, None, [])
    body["status"] = first
    second, events = run(body, None, [], now=LATER)
    assert all(c["lastTransitionTime"] == NOW for c in second["conditions"])
    assert events == []


def test_reconcile_errors_and_crash_loops_degrade() -> None:
    body = isvc()
    status, _ = run(body, None, [], error="applying children failed: Forbidden")
    assert conds(status)["Degraded"]["reason"] == "ReconcileFailed"
    digest = desired(body)["metadata"]["annotations"][LABEL_HASH]
    crashing = pod(digest, False, waiting={"reason": "CrashLoopBackOff"})
    status, _ = run(body, observed_dep(body, ready=0), [crashing])
    c = conds(status)
    assert c["Degraded"]["reason"] == "ServerCrashing" and "CUDA OOM" in c["Degraded"]["message"]


def test_scaled_to_zero_and_autoscaled_replicas() -> None:
    body = isvc({"autoscaling": {"minReplicas": 0, "maxReplicas": 2}})
    dep = observed_dep(body, ready=0)
    dep["spec"]["replicas"] = 0  # set by the autoscaler, not by the operator
    dep["status"].update(replicas=0, updatedReplicas=0)
    status, _ = run(body, dep, [])
    c = conds(status)
    # the router wakes it on a request: it can serve
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("True", "ScaledToZero") and status[
        "phase"
    ] == "Idle"
    assert c["Degraded"]["status"] == "False"

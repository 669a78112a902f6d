"""The kopf operator run for real against a real kube-apiserver 1.20 + controller-manager (Deployments ->
ReplicaSets -> Pods, garbage collection). The fake kubelet plays the node: it runs init containers' commands
as local processes and marks pods ready."""

from __future__ import annotations

import time

import kubernetes
import pytest
from op_helpers import running_operator
from skiff.embedded import embedded_model_path
from skiff_operator.metadata import FIELD_MANAGER, LABEL_HASH, LABEL_ISVC
from skiff_operator.spec import GROUP, PLURAL, VERSION
from support.kube import Api, create_isvc, get_isvc, patch_isvc_spec, wait_for_api

pytestmark = pytest.mark.timeout(300)


def condition(obj: dict, ctype: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == ctype), {})


def ready_at(api: Api, ns: str, name: str, generation: int, status: str = "True"):
    def check():
        obj = get_isvc(api, ns, name)
        c = condition(obj, "Ready")
        ok = c.get("status") == status and obj["status"].get("observedGeneration") == generation
        return obj if ok and c.get("observedGeneration") == generation else None

    return check


def available_at(api: Api, ns: str, name: str, generation: int):
    def check():
        obj = get_isvc(api, ns, name)
        c = condition(obj, "Available")
        return obj if c.get("status") == "True" and c.get("observedGeneration") == generation else None

    return check


def pods(api: Api, ns: str, name: str) -> list:
    return [
        p
        for p in api.core.list_namespaced_pod(ns, label_selector=f"{LABEL_ISVC}={name}").items
        if not p.metadata.deletion_timestamp
    ]


def replica_sets(api: Api, ns: str, name: str) -> list:
    return api.apps.list_namespaced_replica_set(ns, label_selector=f"{LABEL_ISVC}={name}").items


def test_lifecycle_create_ready_update_scale_delete(api: Api, namespace: str, operator, kubelet) -> None:
    ns = namespace
    create_isvc(api, ns, "chat", {"resources": {"gpus": 0}, "runtime": {"dtype": "float32"}})
    stored = get_isvc(api, ns, "chat")
    assert stored["spec"]["runtime"]["tensorParallel"] == 1  # schema defaults applied by the API server
    assert stored["spec"]["routing"] == {"strategy": "prefixHash", "prefixChars": 256}

    obj = wait_for_api(ready_at(api, ns, "chat", 1), 60, "Ready=True at generation 1")
    assert obj["status"]["phase"] == "Ready" and obj["status"]["readyReplicas"] == 1
    assert obj["status"]["url"] == f"http://chat.{ns}.svc.cluster.local/v1"
    assert obj["status"]["selector"] == "skiff.dev/inferenceservice=chat,skiff.dev/role=main"
    assert condition(obj, "ModelReady")["reason"] == "EmbeddedModel"
    dep = api.apps.read_namespaced_deployment("chat", ns)
    assert dep.metadata.owner_references[0].controller is True
    assert {s.metadata.name for s in api.core.list_namespaced_service(ns).items} == {"chat", "chat-pods"}
    assert api.core.read_namespaced_service("chat-pods", ns).spec.cluster_ip == "None"

    def pdb_names() -> list[str] | None:  # 1.20 serves policy/v1beta1 only
        items = api.custom.list_namespaced_custom_object("policy", "v1beta1", ns, "poddisruptionbudgets")[
            "items"
        ]
        return [p["metadata"]["name"] for p in items] or None

    # Ready needs a ready pod, not every child: a child whose apply failed is retried (seen once in CI)
    assert wait_for_api(pdb_names, 30, "the PodDisruptionBudget") == ["chat"]
    events = api.core.list_namespaced_event(ns, field_selector="involvedObject.name=chat").items
    assert any(e.reason == "Ready" for e in events)

    # A spec change rolls: the old pod keeps serving (Ready), the new template is not Available until its
    # own pod is ready, and Progressing says so.
    first_hash = dep.metadata.annotations[LABEL_HASH]
    kubelet.hold = True
    patch_isvc_spec(api, ns, "chat", {"runtime": {"dtype": "bfloat16"}})
    wait_for_api(lambda: len(pods(api, ns, "chat")) == 2, 30, "a surge pod next to the serving one")
    obj = wait_for_api(
        lambda: (o := get_isvc(api, ns, "chat"))["status"].get("observedGeneration") == 2 and o, 30, "gen 2"
    )
    assert condition(obj, "Ready")["status"] == "True" and condition(obj, "Available")["status"] == "False"
    assert condition(obj, "Progressing")["status"] == "True" and obj["status"]["phase"] == "Updating"
    kubelet.hold = False
    wait_for_api(available_at(api, ns, "chat", 2), 60, "Available=True at generation 2")
    wait_for_api(lambda: len(pods(api, ns, "chat")) == 1, 30, "the old pod removed")
    new_hash = api.apps.read_namespaced_deployment("chat", ns).metadata.annotations[LABEL_HASH]
    assert new_hash != first_hash
    assert all(p.metadata.labels[LABEL_HASH] == new_hash for p in pods(api, ns, "chat"))
    command = pods(api, ns, "chat")[0].spec.containers[0].command
    assert command[command.index("--dtype") + 1] == "bfloat16"

    # The scale subresource (what kubectl scale / HPA / KEDA use) scales without a rollout.
    api.custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, ns, PLURAL, "chat", {"spec": {"replicas": 2}}
    )
    wait_for_api(
        lambda: get_isvc(api, ns, "chat")["status"].get("readyReplicas") == 2, 60, "2 ready replicas"
    )
    obj = wait_for_api(available_at(api, ns, "chat", 3), 30, "Available at generation 3")
    scale = wait_for_api(
        lambda: (
            (s := api.custom.get_namespaced_custom_object_scale(GROUP, VERSION, ns, PLURAL, "chat"))[
                "status"
            ]["replicas"]
            == 2
            and s
        ),
        30,
        "the scale subresource at 2",
    )
    assert scale["status"]["selector"] == obj["status"]["selector"]
    assert len([rs for rs in replica_sets(api, ns, "chat") if rs.spec.replicas]) == 1

    # Deletion is garbage collection: every child goes with its owner, no finalizer holds it.
    assert not get_isvc(api, ns, "chat")["metadata"].get("finalizers")
    api.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "chat")
    wait_for_api(lambda: not api.apps.list_namespaced_deployment(ns).items, 60, "Deployment collected")
    wait_for_api(lambda: not api.core.list_namespaced_service(ns).items, 60, "Services collected")
    wait_for_api(lambda: not pods(api, ns, "chat"), 60, "pods collected")


def test_missing_model_degrades_then_recovers(api: Api, namespace: str, operator, kubelet) -> None:
    ns = namespace
    create_isvc(
        api, ns, "lost", {"model": {"source": "file:///nonexistent/models/qwen"}, "resources": {"gpus": 0}}
    )

    def degraded():
        c = condition(get_isvc(api, ns, "lost"), "Degraded")
        return c if c.get("status") == "True" else None

    c = wait_for_api(degraded, 60, "Degraded=True")
    assert c["reason"] == "ModelUnavailable"
    assert "model not found: /nonexistent/models/qwen does not exist" in c["message"]  # from `skiff download`
    obj = get_isvc(api, ns, "lost")
    assert condition(obj, "Ready")["status"] == "False" and obj["status"]["phase"] == "Degraded"
    warnings = api.core.list_namespaced_event(
        ns, field_selector="involvedObject.name=lost,type=Warning"
    ).items
    assert any(e.reason == "ModelUnavailable" for e in warnings)

    patch_isvc_spec(api, ns, "lost", {"model": {"source": f"file://{embedded_model_path()}"}})
    obj = wait_for_api(ready_at(api, ns, "lost", 2), 90, "Ready after fixing the source")
    assert condition(obj, "Degraded")["status"] == "False"
    assert condition(obj, "ModelReady")["reason"] == "ModelAvailable"


def children_uids(api: Api, ns: str, name: str) -> dict:
    """The uids of everything the InferenceService owns, directly or through its Deployment."""
    return {
        "deployment": api.apps.read_namespaced_deployment(name, ns).metadata.uid,
        "services": sorted(s.metadata.uid for s in api.core.list_namespaced_service(ns).items),
        "replicasets": sorted(rs.metadata.uid for rs in replica_sets(api, ns, name)),
        "pods": sorted(p.metadata.uid for p in pods(api, ns, name)),
    }


def test_operator_restart_creates_no_duplicates(
    api: Api, namespace: str, kubelet, operator_kubeconfig
) -> None:
    ns = namespace
    with running_operator(ns, operator_kubeconfig):
        create_isvc(api, ns, "stable", {"resources": {"gpus": 0}})
        wait_for_api(ready_at(api, ns, "stable", 1), 60, "Ready before the restart")
    before = children_uids(api, ns, "stable")
    transition = condition(get_isvc(api, ns, "stable"), "Ready")["lastTransitionTime"]
    with running_operator(ns, operator_kubeconfig):
        patch_isvc_spec(api, ns, "stable", {"service": {"annotations": {"team": "ml"}}})  # touches no pod
        wait_for_api(
            lambda: api.core.read_namespaced_service("stable", ns).metadata.annotations, 30, "annotation"
        )
        wait_for_api(ready_at(api, ns, "stable", 2), 30, "Ready at generation 2")
    after = children_uids(api, ns, "stable")
    assert after == before
    assert condition(get_isvc(api, ns, "stable"), "Ready")["lastTransitionTime"] == transition


def test_invalid_crs(api: Api, namespace: str, operator) -> None:
    ns = namespace
    with pytest.raises(kubernetes.client.exceptions.ApiException) as err:
        create_isvc(api, ns, "bad-tp", {"runtime": {"tensorParallel": 3}})
    assert err.value.status == 422 and "spec.runtime.tensorParallel" in err.value.body
    with pytest.raises(kubernetes.client.exceptions.ApiException) as err:
        create_isvc(api, ns, "bad-src", {"model": {"source": "s3://bucket/model"}})
    assert err.value.status == 422 and "spec.model.source" in err.value.body
    # A cross-field (CEL) rule: Kubernetes >= 1.25 rejects it at admission; 1.20 ignores CEL, so the
    # operator's own check stops it and says why.
    create_isvc(api, ns, "bad-gpus", {"runtime": {"tensorParallel": 4}, "resources": {"gpus": 2}})

    def degraded():
        c = condition(get_isvc(api, ns, "bad-gpus"), "Degraded")
        return c if c.get("status") == "True" else None

    c = wait_for_api(degraded, 30, "Degraded for the CEL violation")
    assert c["reason"] == "ReconcileFailed"
    assert "resources.gpus must be 0 (CPU) or at least runtime.tensorParallel" in c["message"]
    assert not api.apps.list_namespaced_deployment(ns).items
    patch_isvc_spec(api, ns, "bad-gpus", {"resources": {"gpus": 4}})
    wait_for_api(lambda: api.apps.list_namespaced_deployment(ns).items, 30, "Deployment after the fix")


def test_autoscaler_owns_replicas_and_deleted_children_return(
    api: Api, namespace: str, operator, kubelet
) -> None:
    ns = namespace
    create_isvc(
        api,
        ns,
        "elastic",
        {"resources": {"gpus": 0}, "autoscaling": {"mode": "operator", "minReplicas": 1, "maxReplicas": 3}},
    )
    wait_for_api(ready_at(api, ns, "elastic", 1), 60, "Ready with the default single replica")
    dep = api.apps.read_namespaced_deployment("elastic", ns)
    ours = [m for m in dep.metadata.managed_fields if m.manager == FIELD_MANAGER]
    assert ours and all("f:replicas" not in (m.fields_v1 or {}).get("f:spec", {}) for m in ours)
    # What kubectl scale, an HPA or the router do: write the CR's scale subresource; the autoscaling
    # handlers carry spec.replicas to the Deployment under their own field manager.
    api.custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, ns, PLURAL, "elastic", {"spec": {"replicas": 2}}
    )
    wait_for_api(
        lambda: get_isvc(api, ns, "elastic")["status"].get("readyReplicas") == 2, 60, "2 ready replicas"
    )
    patch_isvc_spec(api, ns, "elastic", {"runtime": {"dtype": "float32"}})  # a reconcile that rolls the pods
    wait_for_api(available_at(api, ns, "elastic", 2), 90, "Available at generation 2")
    assert api.apps.read_namespaced_deployment("elastic", ns).spec.replicas == 2  # not reset by our apply

    api.core.delete_namespaced_service("elastic", ns, _preload_content=False)  # 1.20 answers a Status
    wait_for_api(lambda: api.core.read_namespaced_service("elastic", ns), 30, "the Service recreated")


def test_autoscaled_service_deletes_without_the_operator(
    api: Api, namespace: str, kubelet, operator_kubeconfig
) -> None:
    """The autoscaler's loop carries no finalizer: `kubectl delete` after the operator is gone completes."""
    ns = namespace
    spec = {"resources": {"gpus": 0}, "autoscaling": {"mode": "operator", "minReplicas": 1, "maxReplicas": 2}}
    with running_operator(ns, operator_kubeconfig):
        create_isvc(api, ns, "orphaned", spec)
        wait_for_api(ready_at(api, ns, "orphaned", 1), 60, "Ready with its autoscaler running")
        assert not get_isvc(api, ns, "orphaned")["metadata"].get("finalizers")
    api.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "orphaned")
    wait_for_api(
        lambda: not api.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"],
        30,
        "the InferenceService deleted with no operator running",
    )


def test_a_deployment_that_cannot_create_pods_degrades(api: Api, namespace: str, operator) -> None:
    """A missing PriorityClass: the Deployment's ReplicaFailure reaches Degraded with its message."""
    ns = namespace
    create_isvc(api, ns, "urgent", {"resources": {"gpus": 0}, "scheduling": {"priorityClassName": "nope"}})

    def degraded():
        c = condition(get_isvc(api, ns, "urgent"), "Degraded")
        return c if c.get("status") == "True" else None

    c = wait_for_api(degraded, 60, "Degraded=True for the missing PriorityClass")
    assert c["reason"] == "ReplicaFailure" and "no PriorityClass with name nope" in c["message"]
    assert get_isvc(api, ns, "urgent")["status"]["phase"] == "Degraded"


@pytest.mark.parametrize("when_deleted", ["Retain", "Delete"])
def test_model_cache_claim_retention(api: Api, namespace: str, operator, when_deleted: str) -> None:
    """spec.modelCache.whenDeleted: Retain (the default) keeps the claim, and its download, when the service
    is deleted; Delete hands it to garbage collection. (The test controller-manager runs no pvc-protection
    controller, so a deleted claim keeps its kubernetes.io/pvc-protection finalizer: marked for deletion.)"""
    ns = namespace
    cache = {"size": "1Gi"} if when_deleted == "Retain" else {"size": "1Gi", "whenDeleted": "Delete"}
    create_isvc(api, ns, "cached", {"model": {"source": "hf://org/smol"}, "modelCache": cache})
    claim = wait_for_api(
        lambda: api.core.read_namespaced_persistent_volume_claim("cached-model-cache", ns), 30, "the claim"
    )
    assert bool(claim.metadata.owner_references) == (when_deleted == "Delete")
    api.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "cached")
    wait_for_api(lambda: not api.apps.list_namespaced_deployment(ns).items, 60, "the Deployment collected")

    def claim_state() -> str:
        c = api.core.read_namespaced_persistent_volume_claim("cached-model-cache", ns)
        return "deleting" if c.metadata.deletion_timestamp else "kept"

    if when_deleted == "Delete":
        assert wait_for_api(lambda: claim_state() == "deleting", 60, "the claim deleted") is True
    else:
        time.sleep(3)  # garbage collection removed the Deployment; it had a few seconds for the claim too
        assert claim_state() == "kept"

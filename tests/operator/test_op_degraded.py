"""Each child failure a user can fix surfaces in the InferenceService's Degraded=True with its cause, read
as a user reads it: `kubectl wait --for=condition=Degraded=True`, `kubectl get -o jsonpath` and `kubectl
describe` with the real kubectl. The test control plane has no scheduler and no kubelet, so the fake
kubelet writes the pod status those leave (support.pod_faults); the operator runs as its installed
ServiceAccount and reads the pods the controller-manager created for its Deployment."""

from __future__ import annotations

import pytest
from support.kube import Api, create_isvc, wait_for_api
from support.kubectl import kubectl
from support.kubelet import FakeKubelet
from support.pod_faults import FAULTS, INSUFFICIENT_GPU

pytestmark = pytest.mark.timeout(120)

EMBEDDED = {"resources": {"gpus": 0}}
CASES = {
    # fault: (spec, Degraded reason, what its message must say)
    "insufficient-gpu": ({"resources": {"gpus": 1}}, "Unschedulable", INSUFFICIENT_GPU),
    "unbound-claim": (
        {"model": {"source": "hf://org/smol"}, "resources": {"gpus": 0}, "modelCache": {"size": "1Gi"}},
        "VolumeNotBound",
        "pod has unbound immediate PersistentVolumeClaims",
    ),
    "err-image-pull": (EMBEDDED, "ImagePullFailed", "ErrImagePull rpc error: code = NotFound"),
    "image-pull-backoff": (EMBEDDED, "ImagePullFailed", "ImagePullBackOff Back-off pulling image"),
    "crash-loop": (EMBEDDED, "ServerCrashing", "CrashLoopBackOff exit code 1: RuntimeError"),
}


def jsonpath(api: Api, ns: str, name: str, path: str) -> str:
    return kubectl(api.kubeconfig, "get", "-n", ns, f"sksvc/{name}", "-o", f"jsonpath={path}")


@pytest.mark.parametrize("fault", list(CASES))
def test_child_failure_degrades_with_its_cause(
    api: Api, namespace: str, operator, kubelet: FakeKubelet, fault: str
) -> None:
    ns, name = namespace, "broken"
    spec, reason, says = CASES[fault]
    kubelet.fault = FAULTS[fault]
    create_isvc(api, ns, name, spec)

    kubectl(
        api.kubeconfig, "wait", "-n", ns, "--for=condition=Degraded=True", f"sksvc/{name}", "--timeout=60s"
    )
    degraded = '{.status.conditions[?(@.type=="Degraded")]'
    assert jsonpath(api, ns, name, degraded + ".reason}") == reason
    message = jsonpath(api, ns, name, degraded + ".message}")
    pod = api.core.list_namespaced_pod(ns).items[0].metadata.name
    assert message.startswith(f"{pod}: ") and says in message, message
    ready = '{.status.conditions[?(@.type=="Ready")]'
    assert jsonpath(api, ns, name, ready + ".status}") == "False"
    assert jsonpath(api, ns, name, ready + ".reason}") == reason
    assert jsonpath(api, ns, name, "{.status.phase}") == "Degraded"
    if fault == "unbound-claim":  # no provisioner, no volume: the claim stays unbound, as `get pvc` shows
        phase = kubectl(
            api.kubeconfig, "get", "-n", ns, "pvc", f"{name}-model-cache", "-o", "jsonpath={.status.phase}"
        )
        assert phase == "Pending"

    def described() -> str | None:  # the Warning event is posted right after the status
        text = kubectl(api.kubeconfig, "describe", "-n", ns, f"sksvc/{name}")
        return text if f"Warning  {reason}" in text else None

    text = wait_for_api(described, 20, f"a Warning {reason} event in kubectl describe")
    assert says in text and "Degraded" in text
    assert "Phase:" in text and "Degraded" in text.split("Phase:")[1].splitlines()[0]

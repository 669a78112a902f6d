"""Pod statuses as a scheduler or a kubelet writes them when a pod cannot run: for a control plane without
either (support.kube_apiserver), so that the operator reads the same objects a real cluster shows. A fault
is a function of the pod (as the kubernetes client returns it) to the status body to patch; FAULTS names
them for parametrized tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

PodStatus = dict[str, Any]
Fault = Callable[[Any], PodStatus]

INSUFFICIENT_GPU = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
UNBOUND_CLAIM = (
    "0/1 nodes are available: 1 pod has unbound immediate PersistentVolumeClaims. "
    "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def unschedulable(message: str) -> Fault:
    """The scheduler's verdict on a pod no node fits: PodScheduled=False, reason Unschedulable."""

    def status(pod: Any) -> PodStatus:
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": _now(),
        }
        return {"phase": "Pending", "conditions": [condition]}

    return status


def _scheduled_waiting(pod: Any, waiting: dict[str, str], restarts: int, last: dict[str, Any]) -> PodStatus:
    """A scheduled pod whose containers wait (the kubelet's view), none of them ready."""
    now = _now()
    containers = [
        {
            "name": c.name,
            "image": c.image,
            "imageID": "",
            "ready": False,
            "started": False,
            "restartCount": restarts,
            "state": {"waiting": waiting},
            "lastState": last,
        }
        for c in pod.spec.containers
    ]
    not_ready = {"status": "False", "reason": "ContainersNotReady", "lastTransitionTime": now}
    return {
        "phase": "Pending" if not restarts else "Running",
        "hostIP": "10.0.0.1",
        "podIP": "10.244.0.250",
        "startTime": now,
        "containerStatuses": containers,
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", **not_ready},
            {"type": "Ready", **not_ready},
        ],
    }


def image_pull(reason: str) -> Fault:
    """The kubelet cannot pull the image: ErrImagePull first, ImagePullBackOff between retries."""

    def status(pod: Any) -> PodStatus:
        image = pod.spec.containers[0].image
        message = (
            f'Back-off pulling image "{image}"'
            if reason == "ImagePullBackOff"
            else f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": not found'
        )
        return _scheduled_waiting(pod, {"reason": reason, "message": message}, 0, {})

    return status


def crash_loop(pod: Any) -> PodStatus:
    """The server exits at start, the kubelet restarts it with a back-off: CrashLoopBackOff, restarts > 0."""
    name = pod.spec.containers[0].name
    last = {
        "terminated": {
            "exitCode": 1,
            "reason": "Error",
            "message": "RuntimeError: the server could not start",
            "startedAt": _now(),
            "finishedAt": _now(),
        }
    }
    waiting = {
        "reason": "CrashLoopBackOff",
        "message": f"back-off 40s restarting failed container={name} pod={pod.metadata.name}",
    }
    return _scheduled_waiting(pod, waiting, 3, last)


FAULTS: dict[str, Fault] = {
    "insufficient-gpu": unschedulable(INSUFFICIENT_GPU),
    "unbound-claim": unschedulable(UNBOUND_CLAIM),
    "err-image-pull": image_pull("ErrImagePull"),
    "image-pull-backoff": image_pull("ImagePullBackOff"),
    "crash-loop": crash_loop,
}

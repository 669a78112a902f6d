"""A fake node for a kube-apiserver without a scheduler or kubelet (see support.kube_apiserver)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import Any

from support.pod_faults import Fault


class FakeKubelet(threading.Thread):
    """Plays the node for pods of the test namespace: runs each init container's command as a local process
    (the model-download step is real: `skiff download` checks the source) and records its exit code and
    message the way the kubelet does; then marks the pod Running and Ready, unless `hold` is set. With a
    `fault` (support.pod_faults), it writes the status that fault leaves instead, as a scheduler or kubelet
    would."""

    def __init__(self, core: Any, namespace: str) -> None:
        super().__init__(daemon=True)
        self.core, self.namespace = core, namespace
        self.hold = False
        self.fault: Fault | None = None
        self.stop_event = threading.Event()
        self.done: set[str] = set()  # uids of pods already handled
        self.ip = 10

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.step()
            except Exception as e:  # noqa: BLE001 - a test helper: keep playing the node
                print(f"fake kubelet: {e!r}")
            self.stop_event.wait(0.3)

    def step(self) -> None:
        pods = self.core.list_namespaced_pod(self.namespace).items
        for pod in pods:
            uid = pod.metadata.uid
            if uid in self.done or pod.metadata.deletion_timestamp or self.hold:
                continue
            self.done.add(uid)
            if self.fault is not None:
                self._patch(pod, self.fault(pod))
            else:
                self._start(pod)

    def _start(self, pod: Any) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        init_statuses = []
        for init in pod.spec.init_containers or []:
            env = {**os.environ, **{e.name: e.value for e in init.env or [] if e.value is not None}}
            env.pop("HOME", None)  # the pod's HOME=/tmp is its own emptyDir; keep the host's here
            proc = subprocess.run(
                init.command + (init.args or []), capture_output=True, text=True, env=env, timeout=120
            )
            message = (proc.stdout + proc.stderr)[-2000:]  # terminationMessagePolicy FallbackToLogsOnError
            init_statuses.append(
                {
                    "name": init.name,
                    "image": init.image,
                    "imageID": "",
                    "ready": proc.returncode == 0,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": proc.returncode,
                            "reason": "Completed" if proc.returncode == 0 else "Error",
                            "message": message,
                            "startedAt": now,
                            "finishedAt": now,
                        }
                    },
                }
            )
            if proc.returncode != 0:
                self._patch(
                    pod,
                    {
                        "phase": "Pending",
                        "initContainerStatuses": init_statuses,
                        "conditions": [
                            {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized"},
                            {"type": "Ready", "status": "False", "reason": "ContainersNotInitialized"},
                        ],
                    },
                )
                return
        self.ip += 1
        containers = [
            {
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": now}},
            }
            for c in pod.spec.containers
        ]
        self._patch(
            pod,
            {
                "phase": "Running",
                "podIP": f"10.244.0.{self.ip}",
                "hostIP": "10.0.0.1",
                "startTime": now,
                "initContainerStatuses": init_statuses,
                "containerStatuses": containers,
                "conditions": [
                    {"type": t, "status": "True", "lastTransitionTime": now}
                    for t in ("Initialized", "ContainersReady", "Ready", "PodScheduled")
                ],
            },
        )

    def _patch(self, pod: Any, status: dict[str, Any]) -> None:
        self.core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": status})

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)

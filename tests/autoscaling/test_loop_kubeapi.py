"""The autoscaler loop end to end on a real kube-apiserver: a request held at a real router scales an
InferenceService from zero, pod load scales it up, idleness brings it to the minimum and then to zero;
replicas go through the scale subresource, the Deployment follows, and a user's HPA is never fought.

The test plays the kubelet: it creates each replica's pod, marks it Ready at 127.0.0.1, and serves that
pod's /metrics from a small HTTP server whose queue length the test sets. Time between decisions is a fake
clock (the windows are tens of seconds; the test takes a few).
"""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
import yaml
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from skiff_operator.autoscaling.loop import Autoscaler
from skiff_operator.render import OperatorSettings, deployment, selector_labels
from skiff_operator.spec import parse_spec
from skiff_router.app import RouterConfig, create_app
from skiff_router.discovery import StaticSource
from support.asgi import ServerThread
from support.kube import Api, create_isvc, create_user_hpa, get_isvc
from support.waiting import wait_for

pytestmark = pytest.mark.timeout(180)
NS = "default"


class PodMetrics:
    def __init__(self) -> None:
        self.queue = 0.0
        app = FastAPI()

        @app.get("/metrics")
        def metrics() -> PlainTextResponse:
            return PlainTextResponse(
                f'# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{{model_name="m"}} {self.queue}\n'
            )

        self.server = ServerThread(app)


class Clock:
    t = 1000.0

    def __call__(self) -> float:
        return self.t


class World:
    def __init__(self, api: Api, name: str, tmp) -> None:
        self.api, self.name = api, name
        self.core, self.apps = api.core, api.apps
        self.pods: dict[str, PodMetrics] = {}
        discovery = tmp / "router.yaml"
        discovery.write_text(yaml.safe_dump({"services": [{"name": name, "models": ["m"], "replicas": 0}]}))
        self.router = ServerThread(create_app(StaticSource(discovery, 0.05), RouterConfig(hold_timeout=20)))
        self.clock = Clock()
        self.scaler = Autoscaler(api.client, (f"http://{self.router.address}/metrics",), clock=self.clock)

    def isvc(self) -> dict:
        return get_isvc(self.api, NS, self.name)

    def replicas(self) -> int:
        return self.isvc()["spec"]["replicas"]

    def step(self, seconds: float = 5.0):
        self.clock.t += seconds
        isvc = self.isvc()
        outcome = asyncio.run(self.scaler.step(isvc))
        self.scaler.sync_deployment(self.isvc())
        return outcome

    def play_kubelet(self, queue_per_pod: float) -> None:
        """Make the pod set match spec.replicas (each pod Ready with its own /metrics) and set their load."""
        want = self.replicas()
        while len(self.pods) < want:
            metrics = PodMetrics()
            pod_name = f"{self.name}-{len(self.pods)}"
            self.core.create_namespaced_pod(
                NS,
                {
                    "metadata": {"name": pod_name, "labels": selector_labels(self.name)},
                    "spec": {
                        "automountServiceAccountToken": False,
                        "containers": [
                            {
                                "name": "server",
                                "image": "skiff",
                                "ports": [{"name": "http", "containerPort": metrics.server.port}],
                            }
                        ],
                    },
                },
            )
            self.core.patch_namespaced_pod_status(
                pod_name,
                NS,
                {
                    "status": {
                        "phase": "Running",
                        "podIP": "127.0.0.1",
                        "conditions": [{"type": "Ready", "status": "True"}],
                    }
                },
            )
            self.pods[pod_name] = metrics
        while len(self.pods) > want:
            pod_name, metrics = self.pods.popitem()
            self.core.delete_namespaced_pod(pod_name, NS, grace_period_seconds=0)
            metrics.server.stop()
        for m in self.pods.values():
            m.queue = queue_per_pod

    def close(self) -> None:
        self.router.stop()
        for m in self.pods.values():
            m.server.stop()


def test_load_scales_up_and_idle_scales_to_zero(kube: Api, tmp_path):
    name = "smol"
    spec = {
        "model": {"source": "hf://org/smol", "servedName": "m"},
        "replicas": 0,
        "autoscaling": {
            "mode": "operator",
            "minReplicas": 0,
            "maxReplicas": 3,
            "metric": "queue",
            "targetPerReplica": 2,
            "scaleUpStabilizationSeconds": 0,
            "scaleDownStabilizationSeconds": 10,
            "maxScaleUpStep": 3,
            "maxScaleDownStep": 3,
            "idleToZeroSeconds": 20,
        },
    }
    isvc = create_isvc(kube, NS, name, spec)
    kube.apps.create_namespaced_deployment(NS, deployment(isvc, parse_spec(isvc["spec"]), OperatorSettings()))
    w = World(kube, name, tmp_path)
    try:
        assert w.step().decision.reason == "Idle" and w.replicas() == 0
        # a request arrives at the router for the model at zero: it is held, and the held count is load
        held = threading.Thread(
            target=lambda: httpx.post(
                f"http://{w.router.address}/v1/completions", json={"model": "m", "prompt": "x"}, timeout=30
            )
        )
        held.start()
        wait_for(
            lambda: (
                'skiff_router_held{model="m"} 1.0' in httpx.get(f"http://{w.router.address}/metrics").text
            ),
            what="request held",
        )
        out = w.step()
        assert (out.decision.reason, w.replicas()) == ("ScaleFromZero", 1)
        assert w.apps.read_namespaced_deployment(name, NS).spec.replicas == 1  # the Deployment follows
        w.play_kubelet(queue_per_pod=5)  # 5 queued on the new pod (+1 held) -> ceil(6/2) = 3
        out = w.step()
        assert (out.decision.reason, w.replicas()) == ("ScaleUp", 3), out
        assert "sglang:num_queue_reqs=5 over 1 pods" in out.detail
        w.play_kubelet(queue_per_pod=2)  # 6 over 3 pods, +1 held, wants 4: capped
        assert (w.step().decision.reason, w.replicas()) == ("AtMaximum", 3)
        held.join(timeout=30)  # the held request timed out at the router; nothing is held any more
        w.play_kubelet(queue_per_pod=0)
        reasons = []
        for _ in range(3):
            reasons.append(w.step().decision.reason)
        assert reasons[0] == "ScaleDownStabilizing" and w.replicas() == 1  # down window covered: to the floor
        assert "ScaleDown" in reasons
        w.play_kubelet(queue_per_pod=0)
        for _ in range(6):
            out = w.step()
            if out.decision.replicas == 0:
                break
        assert (out.decision.reason, w.replicas()) == ("IdleToZero", 0)
        assert w.apps.read_namespaced_deployment(name, NS).spec.replicas == 0
    finally:
        w.close()


def test_a_user_hpa_is_never_fought(kube: Api, tmp_path):
    name = "taken"
    bounds = {"mode": "operator", "minReplicas": 0, "maxReplicas": 3}
    create_isvc(kube, NS, name, {"model": {"source": "hf://org/smol"}, "replicas": 2, "autoscaling": bounds})
    create_user_hpa(kube, NS, "mine", target=name, min_replicas=2, max_replicas=5)
    w = World(kube, name, tmp_path)
    try:
        for _ in range(4):  # no pods, no load, long past every window: still not ours to touch
            out = w.step(seconds=60)
            assert (
                out.decision.reason == "ExternalAutoscaler"
                and "HorizontalPodAutoscaler/mine" in out.decision.message
            )
        assert w.replicas() == 2
    finally:
        w.close()

"""The pure reconcile function: an InferenceService (+ operator settings) -> its desired child objects."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from skiff_contract import API_PORT_NAME, METRICS_PORT_NAME
from skiff_contract.tracing import ENDPOINT_ENV

from .access import KEY_FILE, KeyMount, NetworkPolicySettings, key_mount, network_policy
from .autoscaling.render import autoscaler_objects
from .metadata import LABEL_HASH, child_metadata, common_labels, selector_labels, served_name
from .model_source import ModelVolume, model_volume
from .spec import InferenceServiceSpec, parse_spec

PORT = 8000
METRICS_PORT = 9090


@dataclass(frozen=True)
class OperatorSettings:
    default_image: str = "skiff-project/skiff:0.1.0"
    cluster_domain: str = "cluster.local"
    pdb_api_version: str = "policy/v1"  # policy/v1beta1 on clusters older than 1.21
    hpa_api_version: str = "autoscaling/v2"  # autoscaling/v2beta2 on clusters older than 1.23
    # The router fronts the services: pods without spec.apiKeySecretRef require an internal key (access.py).
    internal_api_keys: bool = False
    key_rotation_min_seconds: float = 300.0
    network_policy: NetworkPolicySettings | None = None  # a NetworkPolicy per InferenceService when set
    traces_endpoint: str = ""  # OTLP/HTTP URL the model pods export request spans to ("" : tracing off)


def service_url(isvc: dict[str, Any], settings: OperatorSettings, spec: InferenceServiceSpec) -> str:
    meta = isvc["metadata"]
    port = "" if spec.service.port == 80 else f":{spec.service.port}"
    return f"http://{meta['name']}.{meta['namespace']}.svc.{settings.cluster_domain}{port}/v1"


def gpu_count(spec: InferenceServiceSpec) -> int:
    return spec.runtime.tensor_parallel if spec.resources.gpus is None else spec.resources.gpus


def serve_command(
    isvc: dict[str, Any], spec: InferenceServiceSpec, model_path: str | None, keyed: bool = False
) -> list[str]:
    """`skiff serve ...` exactly as the pod runs it (the runtime's CLI contract)."""
    rt = spec.runtime
    cmd = ["skiff", "serve"]
    if model_path:
        cmd += ["--model", model_path]
    cmd += ["--served-model-name", served_name(isvc, spec), "--tp", str(rt.tensor_parallel)]
    cmd += ["--host", "0.0.0.0", "--port", str(PORT), "--metrics-port", str(METRICS_PORT)]
    if keyed:
        cmd += ["--api-key-file", KEY_FILE]
    cmd += ["--dtype", rt.dtype]
    optional: list[tuple[str, object]] = [
        ("--max-running-requests", rt.max_running_requests),
        ("--chunked-prefill-size", rt.chunked_prefill_size),
        ("--page-size", rt.page_size),
        ("--mem-fraction", rt.mem_fraction),
        ("--cuda-graph-max-bs", rt.cuda_graph_max_batch),
        ("--context-length", spec.model.context_length),
    ]
    if rt.attention_backend != "auto":
        optional.append(("--attention-backend", rt.attention_backend))
    for flag, value in optional:
        if value is not None:
            cmd += [flag, str(value)]
    return cmd + list(rt.extra_args)


SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}
# Read-only root: HOME and caches (tokenizer conversion, Triton, hub) live on the /tmp emptyDir.
BASE_ENV = [
    {"name": "HOME", "value": "/tmp"},
    {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"},
    {"name": "HF_HOME", "value": "/tmp/.cache/huggingface"},
    {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
]


def _probe(path: str, period: int, timeout: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _resources(spec: InferenceServiceSpec) -> dict[str, Any]:
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if spec.resources.cpu is not None:
        requests["cpu"] = str(spec.resources.cpu)
    if spec.resources.memory is not None:
        requests["memory"] = limits["memory"] = str(spec.resources.memory)
    gpus = gpu_count(spec)
    if gpus:
        requests[spec.resources.gpu_resource_name] = limits[spec.resources.gpu_resource_name] = str(gpus)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def _server_container(
    isvc: dict[str, Any], spec: InferenceServiceSpec, image: str, mv: ModelVolume, key: KeyMount | None
) -> dict:
    env = copy.deepcopy(BASE_ENV) + [dict(e) for e in spec.runtime.env]
    startup_failures = max(1, spec.runtime.startup_timeout_seconds // 10)
    return {
        "name": "server",
        "image": image,
        "command": serve_command(isvc, spec, mv.model_path, keyed=key is not None),
        "env": env,
        "ports": [
            {"name": API_PORT_NAME, "containerPort": PORT, "protocol": "TCP"},
            {"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "startupProbe": _probe("/health_generate", 10, 30, startup_failures),
        "readinessProbe": _probe("/health_generate", 10, 30, 3),
        "livenessProbe": _probe("/health", 15, 10, 4),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(spec.rollout.pre_stop_sleep_seconds)]}}},
        "resources": _resources(spec),
        "securityContext": copy.deepcopy(SECURITY_CONTEXT),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
            *mv.mounts,
            *([key.mount()] if key else []),
        ],
    }


def _init_containers(spec: InferenceServiceSpec, image: str, mv: ModelVolume) -> list[dict[str, Any]]:
    if mv.download_command is None:
        return []
    env = copy.deepcopy(BASE_ENV)
    if spec.model.token_secret_ref:
        ref = spec.model.token_secret_ref
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return [
        {
            "name": "model-download",
            "image": image,
            "command": mv.download_command,
            "env": env,
            "securityContext": copy.deepcopy(SECURITY_CONTEXT),
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *mv.init_mounts],
        }
    ]


def pod_template(
    isvc: dict[str, Any], spec: InferenceServiceSpec, settings: OperatorSettings
) -> dict[str, Any]:
    name = isvc["metadata"]["name"]
    image = spec.runtime.image or settings.default_image
    mv = model_volume(name, spec)
    key = key_mount(isvc, spec, settings.internal_api_keys)
    sched = spec.scheduling
    tolerations = [dict(t) for t in sched.tolerations]
    if gpu_count(spec) and not tolerations:
        tolerations = [
            {"key": spec.resources.gpu_resource_name, "operator": "Exists", "effect": "NoSchedule"}
        ]
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": spec.rollout.termination_grace_period_seconds,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": _init_containers(spec, image, mv),
        "containers": [_server_container(isvc, spec, image, mv, key)],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": str(spec.resources.shm_size)}},
            {"name": "tmp", "emptyDir": {}},
            *mv.volumes,
            *([key.volume()] if key else []),
        ],
    }
    if not pod["initContainers"]:
        del pod["initContainers"]
    server_env = pod["containers"][0]["env"]
    if settings.traces_endpoint and not any(e["name"] == ENDPOINT_ENV for e in server_env):
        server_env.append({"name": ENDPOINT_ENV, "value": settings.traces_endpoint})  # runtime.env wins
    optional = {
        "nodeSelector": dict(sched.node_selector) or None,
        "tolerations": tolerations or None,
        "affinity": copy.deepcopy(sched.affinity),
        "priorityClassName": sched.priority_class_name,
        "runtimeClassName": sched.runtime_class_name,
    }
    pod.update({k: v for k, v in optional.items() if v})
    return {"metadata": {"labels": common_labels(name)}, "spec": pod}


def template_hash(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]


def deployment(
    isvc: dict[str, Any], spec: InferenceServiceSpec, settings: OperatorSettings
) -> dict[str, Any]:
    name = isvc["metadata"]["name"]
    template = pod_template(isvc, spec, settings)
    digest = template_hash(template)
    template["metadata"]["labels"][LABEL_HASH] = digest
    dep_spec: dict[str, Any] = {
        "selector": {"matchLabels": selector_labels(name)},
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {
                "maxSurge": spec.rollout.max_surge,
                "maxUnavailable": spec.rollout.max_unavailable,
            },
        },
        "revisionHistoryLimit": 3,
        "progressDeadlineSeconds": spec.runtime.startup_timeout_seconds + 600,
        "template": template,
    }
    if spec.autoscaling is None:  # with an autoscaler, replicas belong to it (omitted from our apply)
        dep_spec = {"replicas": spec.replicas, **dep_spec}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(isvc, name, {LABEL_HASH: digest}),
        "spec": dep_spec,
    }


def services(isvc: dict[str, Any], spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    name = isvc["metadata"]["name"]
    api = {"name": API_PORT_NAME, "targetPort": API_PORT_NAME, "protocol": "TCP"}
    main = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(isvc, name, spec.service.annotations),
        "spec": {
            "type": spec.service.type,
            "selector": selector_labels(name),
            "ports": [{**api, "port": spec.service.port}],
        },
    }
    # Endpoint discovery for the router (one DNS record per ready pod) and the pods' metrics port: only
    # here, so a ServiceMonitor scrapes each pod once and a LoadBalancer Service never exposes /metrics.
    metrics = {"name": METRICS_PORT_NAME, "port": METRICS_PORT, "targetPort": METRICS_PORT_NAME}
    headless = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(isvc, f"{name}-pods"),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(name),
            "ports": [{**api, "port": PORT}, {**metrics, "protocol": "TCP"}],
        },
    }
    return [main, headless]


def disruption_budget(
    isvc: dict[str, Any], spec: InferenceServiceSpec, settings: OperatorSettings
) -> dict | None:
    d = spec.disruption
    if not d.enabled:
        return None
    budget = (
        {"minAvailable": d.min_available}
        if d.min_available is not None
        else {"maxUnavailable": 1 if d.max_unavailable is None else d.max_unavailable}
    )
    name = isvc["metadata"]["name"]
    return {
        "apiVersion": settings.pdb_api_version,
        "kind": "PodDisruptionBudget",
        "metadata": child_metadata(isvc, name),
        "spec": {"selector": {"matchLabels": selector_labels(name)}, **budget},
    }


def cache_claim(isvc: dict[str, Any], spec: InferenceServiceSpec) -> dict[str, Any] | None:
    cache = spec.model_cache
    if cache is None or cache.size is None:
        return None
    claim: dict[str, Any] = {
        "accessModes": [cache.access_mode],
        "resources": {"requests": {"storage": str(cache.size)}},
    }
    if cache.storage_class:
        claim["storageClassName"] = cache.storage_class
    metadata = child_metadata(isvc, f"{isvc['metadata']['name']}-model-cache")
    if cache.when_deleted == "Retain":  # no owner: garbage collection leaves it (applying drops our old one)
        del metadata["ownerReferences"]
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": claim}


def desired_children(isvc: dict[str, Any], settings: OperatorSettings | None = None) -> list[dict[str, Any]]:
    """Every object the InferenceService should own, in apply order. Raises pydantic.ValidationError."""
    settings = settings or OperatorSettings()
    spec = parse_spec(isvc.get("spec"))
    children = [cache_claim(isvc, spec), deployment(isvc, spec, settings), *services(isvc, spec)]
    children.append(disruption_budget(isvc, spec, settings))
    if settings.network_policy is not None:
        children.append(network_policy(isvc, settings.network_policy))
    children += autoscaler_objects(isvc, settings.hpa_api_version)
    return [c for c in children if c is not None]

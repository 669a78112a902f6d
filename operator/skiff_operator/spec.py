"""The InferenceService spec and status as typed models: the one source of truth for the CRD schema
(see schema.py), the docs (docgen.py) and the reconcile function's typed view of a CR."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

# the CRD's coordinates live in skiff_contract (the router uses them too); re-exported for the operator
from skiff_contract import GROUP as GROUP
from skiff_contract import KIND as KIND
from skiff_contract import PLURAL as PLURAL
from skiff_contract import SINGULAR as SINGULAR
from skiff_contract import VERSION as VERSION

# Kubernetes int-or-string (25%, 1) and resource quantities ("500m", "16Gi", 2).
IntOrString = Annotated[int | str, WithJsonSchema({"x-kubernetes-int-or-string": True})]
Quantity = Annotated[
    int | str,
    WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": r"^[0-9]+(\.[0-9]+)?(m|[KMGTPE]i?)?$"}),
]
# Free-form Kubernetes objects (affinity, tolerations, env entries) are validated by the API server where
# they land (the pod), so the CRD keeps them opaque.
OpaqueObject = Annotated[
    dict[str, Any], WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True})
]

MODEL_SOURCE_PATTERN = r"^(hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9._/-]+)?|pvc://[a-z0-9]([a-z0-9.-]*[a-z0-9])?(/[^\s]*)?|file:///[^\s]*)$"
OWNED_FLAGS = "model|served-model-name|tp|host|port|metrics-port|api-key|api-key-file|dtype"


def rules(*pairs: tuple[str, str]) -> dict[str, Any]:
    """CEL `x-kubernetes-validations` (rule, message) pairs for a model or field schema."""
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in pairs]}


def nested(model: type[BaseModel], description: str) -> Any:
    """A sub-object that is always present: defaulted to {} by the API server, so its fields' defaults apply."""
    return Field(default_factory=model, description=description, json_schema_extra={"default": {}})


class Base(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class SecretKeyRef(Base):
    """A key in a Secret of the InferenceService's namespace."""

    name: str = Field(min_length=1, description="Secret name.")
    key: str = Field(default="token", description="Key inside the Secret.")


class ModelSpec(Base):
    """What to serve. Without `source` the runtime serves its embedded SmolLM2-135M-Instruct."""

    source: str | None = Field(
        default=None,
        max_length=1024,
        pattern=MODEL_SOURCE_PATTERN,
        description="hf://org/name[@revision] (downloaded by an init container), pvc://claim/path "
        "(a path inside an existing PersistentVolumeClaim) or file:///path (a node path, mounted read-only).",
    )
    served_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Model name clients put in requests (default: the InferenceService name).",
    )
    tokenizer: str | None = Field(
        default=None, description="Tokenizer path inside the model, if not with it."
    )
    token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret holding the Hugging Face token (HF_TOKEN) for hf:// sources."
    )
    context_length: int | None = Field(default=None, ge=1, description="Override the model's context length.")

    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "!has(self.tokenSecretRef) || (has(self.source) && self.source.startsWith('hf://'))",
                "model.tokenSecretRef is only used with hf:// sources",
            ),
        )
    )


class RuntimeSpec(Base):
    """Options of `skiff serve` in each pod."""

    image: str | None = Field(
        default=None, description="Runtime image (default: the operator's --default-image)."
    )
    tensor_parallel: Literal[1, 2, 4, 8] = Field(default=1, description="Tensor-parallel ranks in one pod.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="Weight dtype."
    )
    max_running_requests: int | None = Field(default=None, ge=1, description="Cap on the running batch.")
    chunked_prefill_size: int | None = Field(default=None, ge=1, description="Prefill chunk size in tokens.")
    page_size: int | None = Field(default=None, ge=1, le=1024, description="KV-cache page size in tokens.")
    mem_fraction: float | None = Field(
        default=None, gt=0, le=1, description="Fraction of accelerator memory for weights and KV cache."
    )
    attention_backend: Literal["auto", "torch", "flashinfer"] = Field(
        default="auto", description="Attention kernels."
    )
    cuda_graph_max_batch: int | None = Field(
        default=None, ge=0, description="Largest batch captured in a CUDA graph."
    )
    extra_args: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list,
        max_length=64,
        description="More `skiff serve` arguments; flags the operator sets itself are rejected.",
        json_schema_extra=rules(
            (
                f"self.all(a, !a.matches('^--({OWNED_FLAGS})(=|$)'))",
                "runtime.extraArgs must not set flags the operator owns (--model, --served-model-name, --tp, "
                "--host, --port, --metrics-port, --api-key, --api-key-file, --dtype); use the matching spec "
                "fields",
            ),
        ),
    )
    env: list[OpaqueObject] = Field(default_factory=list, description="Extra container env entries (EnvVar).")
    startup_timeout_seconds: int = Field(
        default=1800, ge=60, description="How long loading may take before the pod is restarted."
    )


class ResourcesSpec(Base):
    """Pod resources. GPUs default to runtime.tensorParallel; 0 runs on CPU."""

    gpus: int | None = Field(default=None, ge=0, le=16, description="Accelerators per pod.")
    gpu_resource_name: str = Field(
        default="nvidia.com/gpu", description="Extended resource name of the accelerator."
    )
    cpu: Quantity | None = Field(default=None, description="CPU request.")
    memory: Quantity | None = Field(default=None, description="Memory request and limit.")
    shm_size: Quantity = Field(default="8Gi", description="Size limit of the memory-backed /dev/shm (NCCL).")


class AutoscalingSpec(Base):
    """Autoscaling policy; the operator then leaves the Deployment's replicas to the autoscaler."""

    mode: Literal["operator", "hpa", "keda"] = Field(default="operator", description="Who scales.")
    min_replicas: int = Field(default=1, ge=0, description="Lower bound (0 allows scale to zero).")
    max_replicas: int = Field(default=4, ge=1, description="Upper bound.")
    metric: Literal["queue", "running", "kvUsage", "concurrency"] = Field(
        default="queue", description="Load signal."
    )
    target_per_replica: float = Field(default=4, gt=0, description="Target value of the metric per replica.")
    scale_up_stabilization_seconds: int = Field(default=0, ge=0, description="Scale-up stabilization window.")
    scale_down_stabilization_seconds: int = Field(
        default=300, ge=0, description="Scale-down stabilization window."
    )
    max_scale_up_step: int = Field(default=4, ge=1, description="Most replicas added per decision.")
    max_scale_down_step: int = Field(default=1, ge=1, description="Most replicas removed per decision.")
    idle_to_zero_seconds: int = Field(default=600, ge=0, description="Idle time before scaling to zero.")
    prometheus_address: str | None = Field(default=None, description="Prometheus URL (keda mode).")

    model_config = ConfigDict(
        json_schema_extra=rules(
            ("self.minReplicas <= self.maxReplicas", "autoscaling.minReplicas must not exceed maxReplicas"),
            (
                "self.mode != 'keda' || has(self.prometheusAddress)",
                "autoscaling.mode keda needs prometheusAddress",
            ),
            (
                "self.mode != 'hpa' || self.minReplicas >= 1",
                "autoscaling.mode hpa cannot scale to zero: set minReplicas >= 1 or use mode operator/keda",
            ),
        )
    )


class RoutingSpec(Base):
    """How the in-cluster endpoint spreads requests over this service's replicas."""

    strategy: Literal["prefixHash", "leastRequests", "roundRobin"] = Field(
        default="prefixHash", description="Policy."
    )
    prefix_chars: int = Field(default=256, ge=1, description="Prompt characters hashed by prefixHash.")


class SchedulingSpec(Base):
    """Where pods may run."""

    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the pods require.")
    tolerations: list[OpaqueObject] = Field(default_factory=list, description="Pod tolerations.")
    affinity: OpaqueObject | None = Field(default=None, description="Pod affinity (Kubernetes Affinity).")
    priority_class_name: str | None = Field(default=None, description="PriorityClass of the pods.")
    runtime_class_name: str | None = Field(
        default=None, description="RuntimeClass of the pods (e.g. nvidia)."
    )


class RolloutSpec(Base):
    """Rolling update of the Deployment."""

    max_surge: IntOrString = Field(default=1, description="Extra pods during a rollout.")
    max_unavailable: IntOrString = Field(default=0, description="Pods that may be missing during a rollout.")
    termination_grace_period_seconds: int = Field(
        default=120, ge=0, description="Time a stopping pod gets to drain in-flight requests."
    )
    pre_stop_sleep_seconds: int = Field(
        default=10, ge=0, description="Pause before SIGTERM so routers stop sending new requests."
    )


class DisruptionSpec(Base):
    """The PodDisruptionBudget."""

    enabled: bool = Field(default=True, description="Create a PodDisruptionBudget.")
    max_unavailable: IntOrString | None = Field(
        default=None, description="Default 1 unless minAvailable is set."
    )
    min_available: IntOrString | None = Field(default=None, description="Alternative to maxUnavailable.")

    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "!(has(self.maxUnavailable) && has(self.minAvailable))",
                "disruption: set maxUnavailable or minAvailable, not both",
            ),
        )
    )


class ServiceSpec(Base):
    """The ClusterIP (or other type) Service in front of the pods."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", description="Service type."
    )
    port: int = Field(default=80, ge=1, le=65535, description="Service port (targets the pods' port 8000).")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations of the Service.")


class ModelCacheSpec(Base):
    """Where hf:// downloads go: an existing PVC, or a new one the operator creates (kept when the
    InferenceService is deleted unless whenDeleted is Delete). Without modelCache an emptyDir is used
    (downloaded per pod)."""

    pvc: str | None = Field(default=None, description="Existing PersistentVolumeClaim.")
    storage_class: str | None = Field(default=None, description="StorageClass of a new claim.")
    size: Quantity | None = Field(default=None, description="Size of a new claim.")
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"] = Field(
        default="ReadWriteOnce",
        description="Access mode of a new claim (ReadWriteMany for replicas on many nodes).",
    )
    when_deleted: Literal["Retain", "Delete"] = Field(
        default="Retain",
        description="What happens to a new claim when the InferenceService is deleted (as StatefulSet's"
        " persistentVolumeClaimRetentionPolicy): Retain keeps it (a re-create reuses the download), Delete"
        " removes it with the service.",
    )

    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "has(self.pvc) != has(self.size)",
                "modelCache: set pvc (an existing claim) or size (a new claim), exactly one",
            ),
            ("!has(self.storageClass) || has(self.size)", "modelCache.storageClass needs size"),
        )
    )


class InferenceServiceSpec(Base):
    """Desired state of an InferenceService."""

    model: ModelSpec = nested(ModelSpec, "The model to serve.")
    runtime: RuntimeSpec = nested(RuntimeSpec, "Runtime options.")
    resources: ResourcesSpec = nested(ResourcesSpec, "Pod resources.")
    replicas: int = Field(
        default=1, ge=0, description="Pods, when no autoscaler owns them (scale subresource)."
    )
    autoscaling: AutoscalingSpec | None = Field(default=None, description="Autoscaling policy.")
    routing: RoutingSpec = nested(RoutingSpec, "In-cluster routing policy.")
    scheduling: SchedulingSpec = nested(SchedulingSpec, "Pod placement.")
    rollout: RolloutSpec = nested(RolloutSpec, "Rolling updates and draining.")
    disruption: DisruptionSpec = nested(DisruptionSpec, "PodDisruptionBudget.")
    service: ServiceSpec = nested(ServiceSpec, "The Service.")
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the API keys the pods require (one per line; mounted as a file the "
        "runtime re-reads). Without it, and with the router in front, the operator keeps an internal key "
        "in the Secret <name>-internal-key.",
    )
    model_cache: ModelCacheSpec | None = Field(
        default=None, description="Cache volume for downloaded models."
    )

    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "!has(self.resources) || !has(self.resources.gpus) || self.resources.gpus == 0 || "
                "self.resources.gpus >= (has(self.runtime) && has(self.runtime.tensorParallel) ? "
                "self.runtime.tensorParallel : 1)",
                "resources.gpus must be 0 (CPU) or at least runtime.tensorParallel",
            ),
            (
                "!has(self.modelCache) || (has(self.model) && has(self.model.source) && "
                "self.model.source.startsWith('hf://'))",
                "modelCache is only used with hf:// model sources",
            ),
        )
    )


class Condition(Base):
    """A metav1.Condition."""

    type: str = Field(description="Ready, Available, ModelReady, Progressing or Degraded.")
    status: Literal["True", "False", "Unknown"] = Field(description="Condition status.")
    reason: str = Field(description="CamelCase machine-readable reason.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int = Field(default=0, description="Generation the condition was computed for.")


class AutoscalingStatus(Base):
    """The autoscaler's last decision (mode: operator)."""

    desired_replicas: int | None = Field(default=None, description="Replicas the last decision asked for.")
    current_replicas: int | None = Field(default=None, description="Replicas when it decided.")
    reason: str | None = Field(default=None, description="CamelCase reason of the decision.")
    message: str | None = Field(default=None, description="Human-readable detail of the decision.")
    metric: str | None = Field(default=None, description="The metric it scaled on.")
    observed: str | None = Field(default=None, description="What it read (metric values per replica).")
    last_decision_time: str | None = Field(default=None, description="When it last decided (RFC 3339).")
    last_scale_time: str | None = Field(default=None, description="When it last changed replicas (RFC 3339).")


class InferenceServiceStatus(Base):
    """Observed state, written by the operator."""

    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Available, ModelReady, Progressing, Degraded.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(default=None, description="Generation the status describes.")
    desired_replicas: int | None = Field(default=None, description="Replicas wanted now.")
    replicas: int | None = Field(default=None, description="Pods that exist (scale subresource).")
    ready_replicas: int | None = Field(default=None, description="Pods passing the readiness probe.")
    updated_replicas: int | None = Field(default=None, description="Pods of the current template.")
    selector: str | None = Field(default=None, description="Label selector of the pods (scale subresource).")
    url: str | None = Field(default=None, description="In-cluster OpenAI base URL.")
    served_model: str | None = Field(default=None, description="Model name clients request.")
    phase: str | None = Field(
        default=None, description="Pending, Loading, Ready, Updating, Degraded or Idle."
    )
    autoscaling: AutoscalingStatus | None = Field(default=None, description="The autoscaler's last decision.")


def parse_spec(spec: dict[str, Any] | None) -> InferenceServiceSpec:
    """The typed, defaulted view of a CR's spec (raises pydantic.ValidationError on bad input)."""
    return InferenceServiceSpec.model_validate(spec or {})

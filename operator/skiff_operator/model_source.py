"""Model sources (hf://, pvc://, file://, embedded; parsed by skiff_contract) -> the pod's model volume,
mounts and download step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from skiff_contract import parse_source

from .spec import InferenceServiceSpec

MODEL_ROOT = "/models"


@dataclass(frozen=True)
class ModelVolume:
    model_path: str | None  # --model for `skiff serve`; None serves the embedded model
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)  # of the server container
    init_mounts: list[dict[str, Any]] = field(default_factory=list)  # of the download init container
    download_command: list[str] | None = None


def model_volume(name: str, spec: InferenceServiceSpec) -> ModelVolume:
    src = parse_source(spec.model.source)
    if src.scheme == "embedded":
        return ModelVolume(model_path=None)
    if src.scheme == "hf":
        dest = f"{MODEL_ROOT}/hf/{src.location}"
        cache = spec.model_cache
        if cache is None:
            volume: dict[str, Any] = {"name": "model", "emptyDir": {}}
        else:
            claim = cache.pvc or f"{name}-model-cache"
            volume = {"name": "model", "persistentVolumeClaim": {"claimName": claim}}
        command = ["skiff", "download", spec.model.source or "", "--dest", dest]
        return ModelVolume(
            model_path=dest,
            volumes=[volume],
            mounts=[{"name": "model", "mountPath": MODEL_ROOT, "readOnly": True}],
            init_mounts=[{"name": "model", "mountPath": MODEL_ROOT}],
            download_command=command,
        )
    if src.scheme == "pvc":
        mount = f"{MODEL_ROOT}/pvc"
        path = f"{mount}/{src.path}" if src.path else mount
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": src.location, "readOnly": True}}
        mounts = [{"name": "model", "mountPath": mount, "readOnly": True}]
        return ModelVolume(
            model_path=path,
            volumes=[volume],
            mounts=mounts,
            init_mounts=mounts,
            download_command=["skiff", "download", spec.model.source or "", "--dest", mount],
        )
    # file: a node path, mounted read-only at the same path so the URI means the same inside the pod
    volume = {"name": "model", "hostPath": {"path": src.location}}
    mounts = [{"name": "model", "mountPath": src.location, "readOnly": True}]
    return ModelVolume(
        model_path=src.location,
        volumes=[volume],
        mounts=mounts,
        init_mounts=mounts,
        download_command=["skiff", "download", spec.model.source or ""],
    )

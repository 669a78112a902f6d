"""Model fetching for `skiff download` (the operator's init container): hf:// through huggingface_hub
(token from HF_TOKEN, resumable, sizes and LFS sha256 checked against the hub's metadata), and pvc:// or
file:// sources, which are only checked for presence and shape."""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from skiff_contract import ModelSource, SourceError
from skiff_contract import parse_source as parse_source_uri
from skiff_contract.model_source import FORMS

MARKER = ".skiff-download.json"
WEIGHT_GLOBS = ("*.safetensors", "*.gguf", "*.bin")
DEFAULT_EXCLUDE = ("original/*", "*.pth", "*.pt", "*.msgpack", "*.h5", "*.onnx")
TERMINATION_LOG = Path("/dev/termination-log")


class DownloadError(Exception):
    """A model that cannot be fetched or is not usable; the message says why."""


def parse_source(uri: str) -> ModelSource:
    """The source `uri` names (skiff_contract's grammar, the operator's too); no URI is an error here."""
    try:
        src = parse_source_uri(uri)
    except SourceError as e:
        raise DownloadError(str(e)) from e
    if src.scheme == "embedded":
        raise DownloadError(f"{uri!r} is not a model source: use {FORMS}")
    return src


def verify_model_path(path: Path) -> str:
    """Raise DownloadError unless `path` looks like a servable model; return a one-line description."""
    if not path.exists():
        raise DownloadError(f"model not found: {path} does not exist")
    if path.is_file():
        if path.suffix not in (".gguf", ".safetensors") or path.stat().st_size == 0:
            raise DownloadError(f"{path} is not a model file (expected a non-empty .gguf or .safetensors)")
        return f"model file {path} ({path.stat().st_size} bytes)"
    ggufs = sorted(path.glob("*.gguf"))
    if ggufs:
        return f"GGUF model {ggufs[0]}"
    if not (path / "config.json").is_file():
        raise DownloadError(f"{path} has no config.json (and no .gguf file): not a model directory")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            raise DownloadError(
                f"{path}: shards listed in {index.name} are missing: {', '.join(missing[:5])}"
            )
    weights = [p for g in WEIGHT_GLOBS for p in path.glob(g)]
    if not weights:
        raise DownloadError(f"{path} has config.json but no weights (*.safetensors, *.gguf, *.bin)")
    return f"model directory {path} ({len(weights)} weight files)"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _wanted(name: str, exclude: tuple[str, ...]) -> bool:
    return not any(fnmatch.fnmatch(name, pattern) for pattern in exclude)


def verify_against_metadata(dest: Path, files: list[dict[str, Any]]) -> None:
    """Every listed file exists with the hub's size; LFS files also match the hub's sha256."""
    for f in files:
        path = dest / f["name"]
        if not path.is_file():
            raise DownloadError(f"verification failed: {f['name']} is missing")
        if f.get("size") is not None and path.stat().st_size != f["size"]:
            raise DownloadError(
                f"verification failed: {f['name']} has {path.stat().st_size} bytes, the hub says {f['size']}"
            )
        if f.get("sha256") and _sha256(path) != f["sha256"]:
            raise DownloadError(f"verification failed: {f['name']} sha256 differs from the hub's")


def fetch_hf(
    src: ModelSource, dest: Path, token: str | None, exclude: tuple[str, ...] = DEFAULT_EXCLUDE
) -> str:
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    uri = f"hf://{src.location}" + (f"@{src.revision}" if src.revision else "")
    try:
        info = HfApi(token=token).model_info(src.location, revision=src.revision, files_metadata=True)
    except GatedRepoError as e:
        raise DownloadError(f"{uri}: gated repository, the token has no access (set HF_TOKEN): {e}") from e
    except RepositoryNotFoundError as e:
        raise DownloadError(f"{uri}: repository not found (or private without a valid HF_TOKEN)") from e
    except RevisionNotFoundError as e:
        raise DownloadError(f"{uri}: revision {src.revision!r} not found") from e
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as e:
        raise DownloadError(f"{uri}: cannot reach the model hub: {e}") from e
    files = [
        {"name": s.rfilename, "size": s.size, "sha256": s.lfs.sha256 if s.lfs else None}
        for s in info.siblings or []
        if _wanted(s.rfilename, exclude)
    ]
    marker = dest / MARKER
    if marker.is_file() and json.loads(marker.read_text()).get("sha") == info.sha:
        verify_against_metadata(dest, files)  # cache hit: still check, a half-written cache must not serve
        return f"{uri} already at {dest} (commit {info.sha})"
    print(
        f"skiff download: {uri} commit {info.sha}: {len(files)} files, "
        f"{sum(f['size'] or 0 for f in files) / 2**30:.2f} GiB -> {dest}",
        flush=True,
    )
    try:  # resumable: partial files in dest/.cache are continued on the next attempt
        snapshot_download(
            src.location, revision=info.sha, local_dir=dest, token=token, ignore_patterns=list(exclude)
        )
    except (HfHubHTTPError, OSError) as e:
        raise DownloadError(f"{uri}: download failed (rerun resumes): {e}") from e
    verify_against_metadata(dest, files)
    marker.write_text(json.dumps({"source": uri, "sha": info.sha, "files": len(files)}))
    return f"{uri} downloaded to {dest} and verified (commit {info.sha})"


def fetch(
    uri: str, dest: str | None, token: str | None = None, exclude: tuple[str, ...] = DEFAULT_EXCLUDE
) -> str:
    """Make the model of `uri` available; returns a description, raises DownloadError."""
    src = parse_source(uri)
    if src.scheme == "file":
        return verify_model_path(Path(src.location))
    if dest is None:
        raise DownloadError(f"{uri}: --dest is required for {src.scheme}:// sources")
    if src.scheme == "pvc":  # dest is where the claim is mounted
        return verify_model_path(Path(dest) / src.path)
    Path(dest).mkdir(parents=True, exist_ok=True)
    return fetch_hf(src, Path(dest), token if token is not None else os.environ.get("HF_TOKEN"), exclude)


def write_termination_message(message: str) -> None:
    """The kubelet shows this file's content in the pod status (it exists only inside a pod)."""
    if TERMINATION_LOG.exists():
        with contextlib.suppress(OSError):
            TERMINATION_LOG.write_text(message[-4000:])

"""`skiff download`: argument and validation paths, pvc:// and file:// checks, hub errors (no hub here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from skiff.download import DownloadError, fetch, parse_source, verify_against_metadata
from skiff.embedded import embedded_model_path
from skiff_contract import SourceError
from skiff_contract import parse_source as contract_parse


def skiff(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "skiff.cli", "download", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_file_source_verifies_a_real_model() -> None:
    path = embedded_model_path()
    out = skiff(f"file://{path}")
    assert out.returncode == 0, out.stderr
    assert "ok: model file" in out.stdout


def test_missing_model_fails_with_a_clear_message(tmp_path) -> None:
    out = skiff(f"file://{tmp_path}/nope")
    assert out.returncode == 1
    assert f"model not found: {tmp_path}/nope does not exist" in out.stderr


def test_directory_checks(tmp_path) -> None:
    (tmp_path / "m").mkdir()
    with pytest.raises(DownloadError, match="no config.json"):
        fetch(f"file://{tmp_path}/m", None)
    (tmp_path / "m/config.json").write_text("{}")
    with pytest.raises(DownloadError, match="no weights"):
        fetch(f"file://{tmp_path}/m", None)
    (tmp_path / "m/model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001.safetensors", "b": "model-00002.safetensors"}})
    )
    (tmp_path / "m/model-00001.safetensors").write_bytes(b"x")
    with pytest.raises(DownloadError, match="missing: model-00002.safetensors"):
        fetch(f"file://{tmp_path}/m", None)
    (tmp_path / "m/model-00002.safetensors").write_bytes(b"y")
    assert "2 weight files" in fetch(f"file://{tmp_path}/m", None)


def test_pvc_source_checks_the_path_under_the_mount(tmp_path) -> None:
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama/model.gguf").write_bytes(b"GGUF")
    assert "GGUF model" in fetch("pvc://models/llama", str(tmp_path))
    out = skiff("pvc://models/other", "--dest", str(tmp_path))
    assert out.returncode == 1 and "does not exist" in out.stderr
    out = skiff("pvc://models/llama")
    assert out.returncode == 1 and "--dest is required" in out.stderr


@pytest.mark.parametrize(
    "uri,fragment",
    [
        ("s3://bucket/x", "unsupported scheme 's3'"),
        ("hf://onlyname", "hf://org/name[@revision]"),
        ("file://relative/path", "absolute path"),
        ("just-a-name", "is not a model source"),
        ("pvc:///models/llama", "pvc sources name a claim"),
    ],
)
def test_bad_sources(uri: str, fragment: str) -> None:
    out = skiff(uri, "--dest", "/tmp/unused")
    assert out.returncode == 1 and fragment in out.stderr


def test_hf_needs_dest_and_reports_an_unreachable_hub(tmp_path) -> None:
    out = skiff("hf://Qwen/Qwen3-0.6B")
    assert out.returncode == 1 and "--dest is required" in out.stderr
    out = skiff("hf://Qwen/Qwen3-0.6B", "--dest", str(tmp_path), env={"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 1 and "cannot reach the model hub" in out.stderr


def test_verification_against_hub_metadata(tmp_path) -> None:
    import hashlib

    (tmp_path / "w.safetensors").write_bytes(b"weights")
    meta = [{"name": "w.safetensors", "size": 7, "sha256": hashlib.sha256(b"weights").hexdigest()}]
    verify_against_metadata(tmp_path, meta)
    with pytest.raises(DownloadError, match="has 7 bytes, the hub says 8"):
        verify_against_metadata(tmp_path, [{**meta[0], "size": 8}])
    with pytest.raises(DownloadError, match="sha256 differs"):
        verify_against_metadata(tmp_path, [{**meta[0], "sha256": "0" * 64}])
    with pytest.raises(DownloadError, match="missing"):
        verify_against_metadata(tmp_path, [{"name": "other.json", "size": 1, "sha256": None}])


@pytest.mark.parametrize(
    "uri,parsed",
    [
        ("hf://Qwen/Qwen3-8B", ("hf", "Qwen/Qwen3-8B", "", None)),
        ("hf://Qwen/Qwen3-8B@v1.0", ("hf", "Qwen/Qwen3-8B", "", "v1.0")),
        ("pvc://models/a/b/c", ("pvc", "models", "a/b/c", None)),
        ("pvc://models", ("pvc", "models", "", None)),
        ("file:///mnt/m", ("file", "/mnt/m", "", None)),
    ],
)
def test_runtime_and_operator_parse_sources_alike(uri: str, parsed: tuple) -> None:
    """One parser (skiff_contract) for `skiff download` and the operator."""
    for src in (parse_source(uri), contract_parse(uri)):
        assert (src.scheme, src.location, src.path, src.revision) == parsed


def test_an_empty_pvc_claim_is_rejected_by_both() -> None:
    with pytest.raises(SourceError, match=r"'pvc:///models': pvc sources name a claim: pvc://claim/path"):
        contract_parse("pvc:///models")
    with pytest.raises(DownloadError, match="pvc sources name a claim"):
        parse_source("pvc:///models")


def test_no_source_is_the_embedded_model_for_the_operator_only() -> None:
    assert contract_parse(None).scheme == contract_parse("").scheme == "embedded"
    with pytest.raises(DownloadError, match="is not a model source"):
        parse_source("")

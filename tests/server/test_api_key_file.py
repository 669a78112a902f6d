"""`skiff serve --api-key-file` (several keys, re-read when the file changes, as a mounted Secret is during a
rotation) and `--metrics-port` (/metrics on its own port only), on a real server process over HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from skiff.server.auth import parse_keys
from support.ports import free_port
from support.serve import ServerProcess, child_env
from support.waiting import wait_for

pytestmark = pytest.mark.timeout(300)
BODY = {"prompt": "hi", "max_tokens": 2}


def swap(path: Path, text: str) -> None:
    """Replace the file the way the kubelet updates a Secret volume: a new file moved into place."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory) -> Iterator[tuple[ServerProcess, Path, int]]:
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text("# the current key first\nsk-current\n\nsk-previous\n")
    metrics_port = free_port()
    srv = ServerProcess(
        "--null-engine", "--api-key-file", str(keys), "--metrics-port", str(metrics_port), api_key=None
    ).wait_ready()
    yield srv, keys, metrics_port
    srv.stop()


def status(srv: ServerProcess, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    model = httpx.get(srv.url + "/v1/models", headers=headers, timeout=10)
    if model.status_code != 200:
        return model.status_code
    body = {**BODY, "model": model.json()["data"][0]["id"]}
    return httpx.post(srv.url + "/v1/completions", json=body, headers=headers, timeout=60).status_code


def test_every_key_in_the_file_is_accepted_and_others_get_an_openai_401(keyed):
    srv, _, _ = keyed
    assert status(srv, "sk-current") == 200
    assert status(srv, "sk-previous") == 200
    for key in (None, "sk-other", "", "# the current key first"):
        r = httpx.get(srv.url + "/v1/models", headers={"Authorization": f"Bearer {key}"} if key else {})
        assert r.status_code == 401, key
        assert r.json()["error"]["code"] == "invalid_api_key" and r.json()["error"]["type"]


def test_a_rotated_file_is_picked_up_without_a_restart(keyed):
    srv, path, _ = keyed
    pid = srv.pid
    try:
        swap(path, "sk-next\nsk-current\n")  # a rotation: the new key, and the one before it
        wait_for(lambda: status(srv, "sk-next") == 200, 10, "the new key accepted")
        assert status(srv, "sk-current") == 200
        assert status(srv, "sk-previous") == 401  # dropped from the file: refused
        swap(path, "")  # an empty Secret fails closed
        wait_for(lambda: status(srv, "sk-next") == 401, 10, "an empty key file refusing every key")
    finally:
        swap(path, "sk-current\nsk-previous\n")
    wait_for(lambda: status(srv, "sk-current") == 200, 10, "the restored key file")
    assert srv.pid == pid and srv.running


def test_metrics_are_on_their_own_port_only(keyed):
    srv, _, metrics_port = keyed
    metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
    assert metrics.status_code == 200 and "sglang:num_running_reqs" in metrics.text
    assert httpx.get(srv.url + "/metrics", timeout=10).status_code == 404
    assert httpx.get(f"http://127.0.0.1:{metrics_port}/v1/models", timeout=10).status_code == 404
    assert httpx.get(srv.url + "/health", timeout=10).status_code == 200  # probes need no key


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--api-key-file", "/nonexistent/keys"], "cannot be read"),
        (["--metrics-port", "0"], "--metrics-port must be a port number"),
    ],
)
def test_bad_key_file_or_metrics_port_is_refused_before_loading(args, message, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "skiff.cli", "serve", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
    )
    assert proc.returncode == 2 and message in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_empty_key_file_is_refused(tmp_path):
    empty = tmp_path / "keys"
    empty.write_text("\n# nothing here\n")
    proc = subprocess.run(
        [sys.executable, "-m", "skiff.cli", "serve", "--api-key-file", str(empty)],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
    )
    assert proc.returncode == 2 and "holds no key" in proc.stdout, proc.stdout + proc.stderr


def test_key_file_format():
    assert parse_keys(" a \n\n# c\nb\na\n") == ("a", "b")

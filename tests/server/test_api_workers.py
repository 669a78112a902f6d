"""`skiff serve --api-workers 2 --detokenizer-workers 2`: two HTTP processes on one port (SO_REUSEPORT)
over one engine (the null engine: real processes, steps that cost nothing)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import httpx
import msgspec
import pytest
from support.process import alive, client_per_process, descendants, http_ok
from support.serve import ServerProcess
from support.waiting import wait_for

pytestmark = pytest.mark.timeout(600)


def start() -> ServerProcess:
    args = ["--null-engine", "--api-workers", "2", "--detokenizer-workers", "2"]
    return ServerProcess(*args, "--max-running-requests", "64", api_key=None).wait_ready()


def clients_per_worker(srv: ServerProcess) -> dict[int, httpx.Client]:
    """One keep-alive client per API worker, keyed by the worker's pid (a connection stays on its worker)."""
    return client_per_process(srv.url, lambda c: c.get("/skiff/processes").json()["api"])


def stream(client: httpx.Client, prompt: str, max_tokens: int) -> tuple[str, int]:
    """(streamed text, completion tokens from the usage chunk)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    body["stream_options"] = {"include_usage": True}
    text, tokens = "", 0
    with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = msgspec.json.decode(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            text += "".join(c["text"] for c in event.get("choices") or [])
    return text, tokens


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    srv = start()
    yield srv
    srv.stop()


def test_both_workers_stream_and_metrics_sum_over_them(server: ServerProcess) -> None:
    from skiff.embedded import embedded_model_path
    from skiff.tokenizer import load_tokenizer

    tok = load_tokenizer(embedded_model_path())
    workers = clients_per_worker(server)
    base = server.metric("sglang:num_requests_total"), server.metric("sglang:generation_tokens_total")
    sent = 0
    for i, client in enumerate(workers.values()):
        for j in range(3):
            prompt = f" worker {i} stream {j} says hello"
            ids = tok.encode(prompt, add_special_tokens=True)
            text, tokens = stream(client, prompt, 12)
            assert tokens == 12
            assert text == tok.decode([ids[k % len(ids)] for k in range(12)])  # the null engine cycles
            sent += 1
        r = client.post("/v1/completions", json={"prompt": "plain", "max_tokens": 5, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
        sent += 1
    # whichever worker answers the scrape, it reports both workers' requests
    for client in workers.values():
        text = client.get("/metrics").text
        page = {
            line.split("{")[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(("sglang:num_requests_total", "sglang:generation_tokens_total"))
        }
        assert page["sglang:num_requests_total"] == base[0] + sent
        assert page["sglang:generation_tokens_total"] == base[1] + 2 * (3 * 12 + 5)
        assert 'skiff:inflight_requests{model_name="SmolLM2-135M-Instruct"} 0.0' in text
    for client in workers.values():
        client.close()


def test_sigterm_stops_every_process_of_the_pod() -> None:
    srv = start()
    try:
        pids = descendants(srv.pid)
        assert len(pids) >= 5  # scheduler, 2 detokenizers, tokenizer, the second API worker
        api_pids = set(clients_per_worker(srv))
        assert srv.pid in api_pids and len(api_pids & pids) == 1
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(60) == 0, srv.log()
        wait_for(lambda: not any(alive(p) for p in pids), 10, "every child process to exit")
        assert not http_ok(srv.url + "/health", 1)
    finally:
        srv.stop()


def test_a_dead_scheduler_fails_every_worker_and_the_pod() -> None:
    srv = start()
    try:
        pids = descendants(srv.pid)
        workers = clients_per_worker(srv)
        os.kill(srv.pids()["scheduler"], signal.SIGKILL)

        def unhealthy(client: httpx.Client) -> bool:
            try:
                return client.get("/health").status_code == 503
            except httpx.HTTPError:
                return True  # already gone

        for client in workers.values():
            wait_for(lambda c=client: unhealthy(c), 10, "both workers to report the dead scheduler")
        assert srv.proc.wait(30) != 0  # so that Kubernetes restarts the pod
        wait_for(lambda: not any(alive(p) for p in pids), 10, "every child process to exit")
    finally:
        srv.stop()

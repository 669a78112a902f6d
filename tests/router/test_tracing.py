"""OpenTelemetry traces end to end: a client's W3C traceparent through a real `skiff-router` to a real
`skiff serve` (embedded SmolLM2-135M on CPU), both exporting over OTLP/HTTP to a receiver in this process
(support.otlp). One request gives one trace, the client's, with the router's and the pod's spans chained."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
import yaml
from support.otlp import OtlpReceiver, ReceivedSpan
from support.serve import PythonService, ServerProcess, small_backend
from support.waiting import wait_for

pytest.importorskip("opentelemetry.sdk", reason="tracing needs the `tracing` extra (opentelemetry-sdk)")
pytestmark = pytest.mark.timeout(600)
ROUTE = "/v1/chat/completions"


class Traced:
    def __init__(self, tmp) -> None:
        self.receiver = OtlpReceiver()
        with pytest.MonkeyPatch.context() as env:
            env.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within 0.1 s instead of 5 s
            self.backend: ServerProcess = small_backend("smol", "--otlp-traces-endpoint", self.receiver.url)
            discovery = tmp / "discovery.yaml"
            service = {"name": "smol", "models": ["smol"], "endpoints": [self.backend.address]}
            discovery.write_text(yaml.safe_dump({"services": [service]}))
            args = ["--static", str(discovery), "--host", "127.0.0.1", "--log-level", "warning"]
            self.router = PythonService(
                "skiff_router.main", [*args, "--otlp-traces-endpoint", self.receiver.url], name="skiff-router"
            )

    def stop(self) -> None:
        self.router.stop()
        self.backend.stop()
        self.receiver.stop()


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> Iterator[Traced]:
    t = Traced(tmp_path_factory.mktemp("traced"))
    try:
        t.router.wait_ready(30)
        t.backend.wait_ready(400)
        yield t
    finally:
        t.stop()


def ask(t: Traced, stream: bool) -> tuple[str, str, httpx.Response]:
    """One chat request carrying a fresh traceparent; (trace id, the client's span id, response)."""
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    body = {
        "model": "smol",
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 6,
        "temperature": 0,
        "stream": stream,
    }
    headers = {"traceparent": f"00-{trace_id}-{parent}-01"}
    r = httpx.post(t.router.url + ROUTE, json=body, headers=headers, timeout=120)
    return trace_id, parent, r


def spans_of(t: Traced, trace_id: str) -> dict[str, ReceivedSpan]:
    """The trace's spans by `service/name`, once all five have arrived."""
    want = {"skiff-router/POST " + ROUTE, "skiff-router/upstream", "skiff-serve/POST " + ROUTE}
    want |= {"skiff-serve/queue_and_prefill", "skiff-serve/decode"}

    def arrived() -> dict[str, ReceivedSpan] | None:
        spans = {f"{s.service}/{s.name}": s for s in t.receiver.trace(trace_id)}
        return spans if want <= spans.keys() else None

    spans = wait_for(arrived, 30, f"the spans of trace {trace_id}")
    assert len(t.receiver.trace(trace_id)) == 5, [s.name for s in t.receiver.trace(trace_id)]
    return spans


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_one_request_is_one_trace_from_client_to_pod(traced: Traced, stream: bool) -> None:
    trace_id, client_span, r = ask(traced, stream)
    assert r.status_code == 200, r.text
    s = spans_of(traced, trace_id)
    router, upstream = s["skiff-router/POST " + ROUTE], s["skiff-router/upstream"]
    pod, prefill, decode = (
        s["skiff-serve/POST " + ROUTE],
        s["skiff-serve/queue_and_prefill"],
        s["skiff-serve/decode"],
    )
    # the chain: client -> router (SERVER) -> upstream (CLIENT) -> pod (SERVER) -> its two phases
    assert (router.parent_span_id, router.kind) == (client_span, "SERVER")
    assert (upstream.parent_span_id, upstream.kind) == (router.span_id, "CLIENT")
    assert (pod.parent_span_id, pod.kind) == (upstream.span_id, "SERVER")
    assert prefill.parent_span_id == pod.span_id and decode.parent_span_id == pod.span_id
    assert upstream.attributes["server.address"] == traced.backend.address
    assert (
        router.attributes["gen_ai.request.model"] == "smol"
        and pod.attributes["gen_ai.request.model"] == "smol"
    )
    for span in (router, upstream, pod):
        assert span.attributes["http.response.status_code"] == 200
    # time: each span inside its parent; the pod's phases back to back
    for child, parent in ((upstream, router), (pod, upstream), (prefill, pod), (decode, pod)):
        assert parent.start_ns <= child.start_ns <= child.end_ns <= parent.end_ns, (child.name, parent.name)
    assert prefill.end_ns == decode.start_ns and decode.end_ns > decode.start_ns
    assert "first_token" in pod.events
    if not stream:
        usage = r.json()["usage"]
        assert decode.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
        assert pod.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
        assert upstream.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    else:
        assert r.text.rstrip().endswith("data: [DONE]")
        assert decode.attributes["gen_ai.usage.output_tokens"] >= 1


def test_a_request_without_traceparent_starts_its_own_trace(traced: Traced) -> None:
    before = {s.trace_id for s in traced.receiver.spans}
    r = httpx.post(
        traced.router.url + ROUTE,
        json={"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        timeout=120,
    )
    assert r.status_code == 200

    def new_trace() -> str | None:
        fresh = {s.trace_id for s in traced.receiver.spans if s.name == "POST " + ROUTE} - before
        return next(iter(fresh), None)

    trace_id = wait_for(new_trace, 30, "a new trace")
    spans = spans_of(traced, trace_id)
    assert spans["skiff-router/POST " + ROUTE].parent_span_id == ""  # the router's span is the root


def test_a_bad_endpoint_is_refused_at_start(tmp_path) -> None:
    from skiff_router.main import main

    discovery = tmp_path / "d.yaml"
    discovery.write_text("services: []\n")
    assert main(["--static", str(discovery), "--otlp-traces-endpoint", "collector:4318"]) == 2


def test_skiff_serve_refuses_a_bad_endpoint_before_loading() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "skiff.cli", "serve", "--otlp-traces-endpoint", "ftp://collector"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--otlp-traces-endpoint must be an http(s) URL, got 'ftp://collector'" in proc.stderr

"""OpenTelemetry traces end to end: a client's W3C traceparent through a real `skiff-router` to a real
`skiff serve` (embedded SmolLM2-135M on CPU), both exporting over OTLP/HTTP to a receiver in this process
(support.otlp). One request gives one trace, the client's, with the router's and the pod's spans chained
and the pod's phases of each choice (tokenize, queue, prefill, detokenize, decode) under the pod's span;
a pod of two API workers traces the requests of both."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
import yaml
from support.otlp import OtlpReceiver, ReceivedSpan
from support.process import client_per_process
from support.serve import PythonService, ServerProcess, small_backend
from support.waiting import wait_for

pytest.importorskip("opentelemetry.sdk", reason="tracing needs the `tracing` extra (opentelemetry-sdk)")
pytestmark = pytest.mark.timeout(600)
ROUTE = "/v1/chat/completions"
PHASES = ("tokenize", "queue", "prefill", "detokenize", "decode")
CLOCK_SLACK_NS = 1_000_000  # the pod's processes stamp their own wall clock: allow 1 ms of disagreement


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


def wait_spans(receiver: OtlpReceiver, trace_id: str, count: int) -> list[ReceivedSpan]:
    """The trace's spans, once `count` have arrived (and no more)."""
    spans = wait_for(
        lambda: receiver.trace(trace_id),
        30,
        f"{count} spans of trace {trace_id}",
        until=lambda s: len(s) >= count,
    )
    assert len(spans) == count, [s.name for s in spans]
    return spans


def spans_of(t: Traced, trace_id: str) -> dict[str, ReceivedSpan]:
    """The routed trace's spans (router, upstream, pod and one choice's phases) by `service/name`, a
    phase's with its choice: `skiff-serve/<phase>/0`."""
    spans = wait_spans(t.receiver, trace_id, 3 + len(PHASES))
    return {span_key(s): s for s in spans}


def span_key(s: ReceivedSpan) -> str:
    choice = s.attributes.get("skiff.choice")
    return f"{s.service}/{s.name}" + ("" if choice is None else f"/{choice}")


def check_phases(pod: ReceivedSpan, spans: list[ReceivedSpan], choices: int) -> list[dict[str, ReceivedSpan]]:
    """Each choice has the five phase spans, children of the pod's span inside its time, back to back:
    tokenize -> queue -> prefill -> decode, with detokenize starting where decode does."""
    out = []
    for choice in range(choices):
        mine = {s.name: s for s in spans if s.attributes.get("skiff.choice") == choice}
        assert set(mine) == set(PHASES), (choice, sorted(mine))
        for s in mine.values():
            assert (s.parent_span_id, s.kind, s.trace_id) == (pod.span_id, "INTERNAL", pod.trace_id)
            assert pod.start_ns <= s.start_ns <= s.end_ns <= pod.end_ns, s.name
        order = [mine[n] for n in ("tokenize", "queue", "prefill", "decode")]
        for before, after in zip(order, order[1:], strict=False):
            assert before.end_ns <= after.start_ns + CLOCK_SLACK_NS, (before.name, after.name)
        detok, decode = mine["detokenize"], mine["decode"]
        assert mine["prefill"].end_ns <= detok.start_ns + CLOCK_SLACK_NS and detok.end_ns <= decode.end_ns
        # real stamps of other processes: the hop to the engine and the first token's way back take time
        assert mine["tokenize"].end_ns > mine["tokenize"].start_ns and detok.end_ns > detok.start_ns
        assert decode.end_ns > decode.start_ns
        out.append(mine)
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_one_request_is_one_trace_from_client_to_pod(traced: Traced, stream: bool) -> None:
    trace_id, client_span, r = ask(traced, stream)
    assert r.status_code == 200, r.text
    s = spans_of(traced, trace_id)
    router, upstream = s["skiff-router/POST " + ROUTE], s["skiff-router/upstream"]
    pod = s["skiff-serve/POST " + ROUTE]
    # the chain: client -> router (SERVER) -> upstream (CLIENT) -> pod (SERVER) -> its phases
    assert {x.trace_id for x in s.values()} == {trace_id}
    assert (router.parent_span_id, router.kind) == (client_span, "SERVER")
    assert (upstream.parent_span_id, upstream.kind) == (router.span_id, "CLIENT")
    assert (pod.parent_span_id, pod.kind) == (upstream.span_id, "SERVER")
    assert upstream.attributes["server.address"] == traced.backend.address
    assert (
        router.attributes["gen_ai.request.model"] == "smol"
        and pod.attributes["gen_ai.request.model"] == "smol"
    )
    for span in (router, upstream, pod):
        assert span.attributes["http.response.status_code"] == 200
    # time: each span inside its parent
    for child, parent in ((upstream, router), (pod, upstream)):
        assert parent.start_ns <= child.start_ns <= child.end_ns <= parent.end_ns, (child.name, parent.name)
    [phases] = check_phases(pod, list(s.values()), 1)
    prefill, decode = phases["prefill"], phases["decode"]
    assert prefill.end_ns > prefill.start_ns  # a real forward pass over the prompt
    assert "first_token" in pod.events
    if not stream:
        usage = r.json()["usage"]
        assert decode.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
        assert prefill.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
        assert pod.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
        assert upstream.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    else:
        assert r.text.rstrip().endswith("data: [DONE]")
        assert decode.attributes["gen_ai.usage.output_tokens"] >= 1
    assert decode.attributes["gen_ai.response.finish_reason"] in ("stop", "length")


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


def test_each_api_worker_traces_its_requests_phases() -> None:
    """`--api-workers 2` (and two detokenizers) over the null engine: a traced request on each worker's
    connection gives that worker's span with every choice's phases, in the client's trace."""
    receiver = OtlpReceiver()
    args = ["--null-engine", "--api-workers", "2", "--detokenizer-workers", "2"]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        srv = ServerProcess(*args, "--otlp-traces-endpoint", receiver.url, api_key=None)
    try:
        srv.wait_ready()
        workers = client_per_process(srv.url, lambda c: c.get("/skiff/processes").json()["api"])
        for client in workers.values():
            trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
            body = {"prompt": "a b c d", "max_tokens": 5, "n": 2, "ignore_eos": True}
            r = client.post(
                "/v1/completions", json=body, headers={"traceparent": f"00-{trace_id}-{parent}-01"}
            )
            assert r.status_code == 200, r.text
            spans = wait_spans(receiver, trace_id, 1 + 2 * len(PHASES))
            [pod] = [s for s in spans if s.name == "POST /v1/completions"]
            assert (pod.parent_span_id, pod.kind, pod.service) == (parent, "SERVER", "skiff-serve")
            for phases in check_phases(pod, spans, 2):
                assert phases["decode"].attributes["gen_ai.usage.output_tokens"] == 5
            client.close()
    finally:
        srv.stop()
        receiver.stop()

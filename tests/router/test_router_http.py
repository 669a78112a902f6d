"""The router over real HTTP against small OpenAI-shaped backends (fakes.py): routing, holding, keys, errors."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest
import yaml
from fakes import fake_backend
from skiff_router.app import RouterConfig, create_app
from skiff_router.discovery import StaticSource
from support.asgi import ServerThread
from support.ports import free_port

pytestmark = pytest.mark.timeout(60)


class Env:
    def __init__(self, tmp_path, **config) -> None:
        self.file = tmp_path / "discovery.yaml"
        self.write([])
        self.source = StaticSource(self.file, interval=0.05)
        self.router = ServerThread(create_app(self.source, RouterConfig(**config)))
        self.url = f"http://{self.router.address}"
        self.backends: list[ServerThread] = []

    def write(self, services: list[dict], keys: list[dict] | None = None) -> None:
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump({"services": services, "apiKeys": keys or []}))
        tmp.replace(self.file)
        time.sleep(0.2)  # two refresh intervals

    def backend(self, name: str, **kw) -> ServerThread:
        b = ServerThread(fake_backend(name, **kw))
        self.backends.append(b)
        return b

    def client(self, key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=30)

    def metric(self, name: str, **labels) -> float:
        text = httpx.get(self.url + "/metrics").text
        total = 0.0
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            if series.split("{")[0] == name and all(f'{k}="{v}"' in series for k, v in labels.items()):
                total += float(value)
        return total

    def close(self) -> None:
        self.router.stop()
        for b in self.backends:
            b.stop()


@pytest.fixture
def env(tmp_path):
    made: list[Env] = []

    def make(**config) -> Env:
        e = Env(tmp_path, **config)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def test_routes_by_model_and_lists_models(env):
    e = env()
    a, b = e.backend("A"), e.backend("B")
    e.write(
        [
            {"name": "svc-a", "models": ["model-a"], "endpoints": [a.address]},
            {"name": "svc-b", "models": ["model-b"], "endpoints": [b.address]},
        ]
    )
    c = e.client()
    assert c.completions.create(model="model-a", prompt="hi", max_tokens=2).choices[0].text == "A:hi"
    chat = c.chat.completions.create(
        model="model-b", messages=[{"role": "user", "content": "yo"}], max_tokens=2
    )
    assert chat.choices[0].message.content == "B:yo"
    assert sorted(m.id for m in c.models.list().data) == ["model-a", "model-b"]
    assert e.metric("skiff_router_routed_total", model="model-a") == 1
    assert httpx.get(e.url + "/health").json()["status"] == "ok"


def test_unknown_model_is_404_and_bad_bodies_are_400(env):
    e = env()
    e.write([{"name": "svc", "models": ["m"], "endpoints": [e.backend("A").address]}])
    with pytest.raises(openai.NotFoundError) as err:
        e.client().completions.create(model="nope", prompt="x", max_tokens=1)
    assert err.value.body["code"] == "model_not_found"
    r = httpx.post(
        e.url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(e.url + "/v1/completions", json={"prompt": "x"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "missing_model"


def test_stream_passes_through_unbuffered_and_strips_injected_usage(env):
    e = env()
    e.write([{"name": "svc", "models": ["m"], "endpoints": [e.backend("A", chunk_delay=0.3).address]}])
    start = time.monotonic()
    arrivals, texts = [], []
    for chunk in e.client().completions.create(model="m", prompt="x", max_tokens=4, stream=True):
        arrivals.append(time.monotonic() - start)
        texts.append(chunk.choices[0].text)
        assert chunk.usage is None  # the router asked for usage itself and keeps that chunk
    assert texts == ["A0 ", "A1 ", "A2 ", "A3 "]
    assert arrivals[-1] - arrivals[0] > 0.6  # chunks arrived as made (0.3 s apart), not all at the end
    assert e.metric("skiff_router_tokens_total", model="m", kind="completion") == 4
    # a client that asks for usage gets it
    chunks = list(
        e.client().chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "a b"}],
            max_tokens=2,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.total_tokens == 4


def test_dead_endpoint_is_routed_around(env):
    e = env(max_attempts=3)
    a = e.backend("A")
    dead = f"127.0.0.1:{free_port()}"
    e.write([{"name": "svc", "models": ["m"], "endpoints": [dead, a.address], "strategy": "roundRobin"}])
    c = e.client()
    for i in range(6):
        assert c.completions.create(model="m", prompt=f"p{i}", max_tokens=1).choices[0].text == f"A:p{i}"
    assert e.metric("skiff_router_retries_total", model="m") >= 1
    assert len(a.server.config.app.state.requests) == 6


def test_no_endpoint_answering_is_a_counted_503(env):
    e = env(max_attempts=2, retry_after=5)
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    e.write([{"name": "svc", "models": ["m"], "endpoints": dead}])
    r = httpx.post(e.url + "/v1/completions", json={"model": "m", "prompt": "x"}, timeout=10)
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert r.json()["error"]["code"] == "upstream_unavailable"
    assert e.metric("skiff_router_rejected_total", model="m", reason="upstream_unavailable") == 1


def test_mid_stream_failure_is_not_retried(env):
    e = env()
    a = e.backend("A", die_after_chunks=2)
    b = e.backend("B")
    e.write([{"name": "svc", "models": ["m"], "endpoints": [a.address, b.address], "strategy": "roundRobin"}])
    seen_error = False
    for _ in range(2):
        with httpx.stream(
            "POST",
            e.url + "/v1/completions",
            json={"model": "m", "prompt": "x", "max_tokens": 5, "stream": True},
        ) as r:
            body = r.read().decode()
        if "upstream_failed" in body:
            seen_error = True
            assert body.count("A0") == 1 and "B0" not in body  # nothing from another backend spliced in
    assert seen_error
    assert len(b.server.config.app.state.requests) == 1  # B only served its own round-robin turn


def test_held_request_completes_after_scale_up(env):
    e = env(hold_timeout=20, keepalive_interval=0.2)
    e.write([{"name": "svc", "models": ["m"], "replicas": 0}])
    results: dict[str, object] = {}

    def plain():
        results["plain"] = (
            e.client().completions.create(model="m", prompt="held", max_tokens=1).choices[0].text
        )

    def streamed():
        with httpx.stream(
            "POST",
            e.url + "/v1/completions",
            timeout=30,
            json={"model": "m", "prompt": "s", "max_tokens": 2, "stream": True},
        ) as r:
            results["status"] = r.status_code
            results["lines"] = list(r.iter_lines())

    threads = [threading.Thread(target=plain), threading.Thread(target=streamed)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while e.metric("skiff_router_held", model="m") < 2:
        assert time.monotonic() < deadline, "requests were not held"
        time.sleep(0.05)
    assert e.metric("skiff_router_scale_from_zero_total", model="m") == 1
    assert e.source.scale_requests == ["svc"]
    time.sleep(0.5)  # the held stream gets progress comments meanwhile
    b = e.backend("A")  # the test plays the scale-up: a replica starts and discovery lists it
    e.write([{"name": "svc", "models": ["m"], "replicas": 1, "endpoints": [b.address]}])
    for t in threads:
        t.join(timeout=20)
    assert results["plain"] == "A:held"
    lines = results["lines"]
    assert results["status"] == 200
    assert any(line.startswith(": skiff: waiting for a ready replica of m") for line in lines)
    assert [line for line in lines if line.startswith("data:")][-1] == "data: [DONE]"
    assert sum("A1 " in line for line in lines) == 1
    assert e.metric("skiff_router_held", model="m") == 0


def test_hold_cap_and_timeout_answer_503_with_retry_after(env):
    e = env(hold_cap=1, hold_timeout=4, retry_after=7)  # slack: the cap check must land inside the hold
    e.write([{"name": "svc", "models": ["m"], "replicas": 0}])
    first: dict[str, httpx.Response] = {}
    t = threading.Thread(
        target=lambda: first.setdefault(
            "r", httpx.post(e.url + "/v1/completions", json={"model": "m", "prompt": "x"}, timeout=10)
        )
    )
    t.start()
    while e.metric("skiff_router_held", model="m") < 1:
        time.sleep(0.02)
    over = httpx.post(e.url + "/v1/completions", json={"model": "m", "prompt": "y"}, timeout=10)
    assert over.status_code == 503 and over.headers["retry-after"] == "7"
    assert over.json()["error"]["code"] == "hold_cap"
    over_stream = httpx.post(
        e.url + "/v1/completions", json={"model": "m", "prompt": "y", "stream": True}, timeout=10
    )
    assert over_stream.status_code == 503 and over_stream.headers["retry-after"] == "7"  # a real 503, not SSE
    t.join(timeout=10)
    assert first["r"].status_code == 503 and first["r"].headers["retry-after"] == "7"
    assert first["r"].json()["error"]["code"] == "hold_timeout"
    # streamed: 200 with progress comments, then an error event once the timeout passes
    with httpx.stream(
        "POST",
        e.url + "/v1/chat/completions",
        timeout=10,
        json={"model": "m", "messages": [{"role": "user", "content": "z"}], "stream": True},
    ) as r:
        body = r.read().decode()
    assert '"code": "hold_timeout"' in body and body.rstrip().endswith("data: [DONE]")
    assert e.metric("skiff_router_rejected_total", model="m", reason="hold_timeout") == 2


def test_api_keys_allowed_models_and_quotas(env):
    e = env(require_api_key=True)
    a = e.backend("A")
    e.write(
        [
            {"name": "svc-a", "models": ["a"], "endpoints": [a.address]},
            {"name": "svc-b", "models": ["b"], "endpoints": [a.address]},
        ],
        keys=[
            {"name": "alice", "key": "sk-alice", "models": ["a"], "rpm": 2},
            {"name": "bob", "key": "sk-bob", "tpm": 10},
        ],
    )
    with pytest.raises(openai.AuthenticationError):
        e.client("sk-wrong").completions.create(model="a", prompt="x", max_tokens=1)
    r = httpx.post(e.url + "/v1/completions", json={"model": "a", "prompt": "x"})
    assert r.status_code == 401
    alice = e.client("sk-alice")
    with pytest.raises(openai.PermissionDeniedError):
        alice.completions.create(model="b", prompt="x", max_tokens=1)
    assert [m.id for m in alice.models.list().data] == ["a"]
    raw = alice.completions.with_raw_response.create(model="a", prompt="x", max_tokens=1)
    assert raw.headers["x-ratelimit-limit-requests"] == "2"
    assert raw.headers["x-ratelimit-remaining-requests"] == "1"
    alice.completions.create(model="a", prompt="x", max_tokens=1)
    with pytest.raises(openai.RateLimitError) as err:
        alice.completions.create(model="a", prompt="x", max_tokens=1)
    assert 1 <= int(err.value.response.headers["retry-after"]) <= 60
    assert err.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    bob = e.client("sk-bob")
    bob.completions.create(model="b", prompt="one two three", max_tokens=8)  # 3 + 8 = 11 tokens >= 10
    with pytest.raises(openai.RateLimitError) as err:
        bob.completions.create(model="b", prompt="x", max_tokens=1)
    assert err.value.response.headers["x-ratelimit-remaining-tokens"] == "0"
    assert len(a.server.config.app.state.requests) == 3  # refused requests never reached a backend


def test_pod_api_key_is_sent_upstream_and_makes_the_model_key_only(env):
    e = env()
    open_backend, private_backend = e.backend("O"), e.backend("P", api_key="sk-pod")
    e.write(
        [
            {"name": "open", "models": ["open"], "endpoints": [open_backend.address]},
            {
                "name": "private",
                "models": ["private"],
                "endpoints": [private_backend.address],
                "apiKey": "sk-pod",
            },
        ],
        keys=[{"name": "team", "key": "sk-team", "models": ["private"], "rpm": 100}],
    )
    assert e.client().completions.create(model="open", prompt="x", max_tokens=1).choices[0].text == "O:x"
    with pytest.raises(
        openai.AuthenticationError
    ):  # anonymous (placeholder key) may not use the private model
        e.client().completions.create(model="private", prompt="x", max_tokens=1)
    for key in ("sk-team", "sk-pod"):  # a router key allowing it, or the pods' own key
        out = e.client(key).completions.create(model="private", prompt="y", max_tokens=1)
        assert out.choices[0].text == "P:y"
    for key in ("sk-pod", "sk-team"):  # a presented key is held to its models, even on an open model
        with pytest.raises(openai.PermissionDeniedError):
            e.client(key).completions.create(model="open", prompt="x", max_tokens=1)
    assert len(private_backend.server.config.app.state.requests) == 2

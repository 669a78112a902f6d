"""The router in front of real `skiff serve` processes (embedded SmolLM2-135M on CPU).

Three backends: A and B serve `smol`, C serves `smol-alt` behind a pod API key and starts "from zero"
(the test plays the scale-up: C boots while requests for it are held, then discovery lists it). Kept few
and short: each backend is a full model process on a 2-core machine.
"""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest
import yaml
from support.serve import PythonService, metric_sum, small_backend

pytestmark = pytest.mark.timeout(600)
BOOT = 400.0
SYSTEM = (
    "You are a careful assistant for a shipping company. Answer questions about parcels, tracking "
    "numbers, customs forms and delivery windows. Keep answers short and polite. "
)


class Cluster:
    def __init__(self, tmp) -> None:
        self.file = tmp / "discovery.yaml"
        self.a, self.b = small_backend("smol"), small_backend("smol")
        self.c = small_backend("smol-alt", "--api-key", "sk-pod-c")
        self.services: dict[str, dict] = {}
        self.keys = [{"name": "tenant", "key": "sk-tenant", "models": ["smol"], "rpm": 1000, "tpm": 60}]
        self.set("smol", endpoints=[self.a.address, self.b.address], strategy="prefixHash", prefixChars=96)
        self.set("smol-alt", endpoints=[], replicas=0, apiKey="sk-pod-c")
        self.router = PythonService(
            "skiff_router.main",
            [
                "--static",
                str(self.file),
                "--host",
                "127.0.0.1",
                "--hold-timeout",
                "500",
                "--keepalive-interval",
                "1",
                "--refresh-interval",
                "0.2",
                "--log-level",
                "warning",
            ],
            name="skiff-router",
        )

    def set(self, model: str, **fields) -> None:
        self.services[model] = {"name": model, "models": [model], **self.services.get(model, {}), **fields}
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump({"services": list(self.services.values()), "apiKeys": self.keys}))
        tmp.replace(self.file)
        time.sleep(0.6)

    def client(self, key: str = "EMPTY") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.router.url + "/v1", api_key=key, max_retries=0, timeout=300)

    def stop(self) -> None:
        for p in (self.router, self.a, self.b, self.c):
            p.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("router-serve"))
    try:
        c.router.wait_ready(30)
        c.a.wait_ready(BOOT)
        c.b.wait_ready(BOOT)
        yield c
    finally:
        c.stop()


def test_held_requests_complete_once_a_backend_starts(cluster):
    c = cluster
    out: dict[str, object] = {}

    def plain():
        out["plain"] = c.client("sk-pod-c").completions.create(
            model="smol-alt", prompt="The sky is", max_tokens=2, temperature=0
        )

    def streamed():
        with httpx.stream(
            "POST",
            c.router.url + "/v1/chat/completions",
            timeout=BOOT,
            headers={"authorization": "Bearer sk-pod-c"},
            json={
                "model": "smol-alt",
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 2,
                "stream": True,
            },
        ) as r:
            out["lines"] = list(r.iter_lines())

    threads = [threading.Thread(target=plain), threading.Thread(target=streamed)]
    for t in threads:
        t.start()
    time.sleep(2)
    assert metric_sum(c.router.url, "skiff_router_held") == 2
    assert metric_sum(c.router.url, "skiff_router_scale_from_zero_total") == 1
    c.c.wait_ready(BOOT)  # the scale-up: C finished loading ...
    c.set("smol-alt", endpoints=[c.c.address], replicas=1)  # ... and discovery lists it
    for t in threads:
        t.join(timeout=120)
    assert out["plain"].choices[0].text and out["plain"].usage.completion_tokens == 2
    lines = out["lines"]
    assert any(line.startswith(": skiff: waiting for a ready replica of smol-alt") for line in lines)
    assert lines[-1] == "data: [DONE]" or lines[-2:] == ["data: [DONE]", ""]
    assert sum('"delta"' in line for line in lines) >= 2
    assert metric_sum(c.router.url, "skiff_router_held") == 0


def test_routes_by_model_with_real_backends(cluster):
    c = cluster
    assert sorted(m.id for m in c.client().models.list().data) == ["smol", "smol-alt"]
    raw = c.client().completions.with_raw_response.create(
        model="smol", prompt="One, two,", max_tokens=2, temperature=0
    )
    assert raw.headers["x-skiff-backend"] in (c.a.address, c.b.address)
    alt = c.client("sk-pod-c").completions.with_raw_response.create(
        model="smol-alt", prompt="One, two,", max_tokens=2, temperature=0
    )
    assert alt.headers["x-skiff-backend"] == c.c.address
    assert alt.parse().choices[0].text == raw.parse().choices[0].text  # same model, greedy: same tokens
    with pytest.raises(openai.NotFoundError):
        c.client().completions.create(model="llama-70b", prompt="x", max_tokens=1)
    with pytest.raises(openai.AuthenticationError):  # C needs a key; the router never lets anonymous through
        c.client().completions.create(model="smol-alt", prompt="x", max_tokens=1)


def test_tokens_per_minute_counted_from_real_usage(cluster):
    tenant = cluster.client("sk-tenant")
    with pytest.raises(openai.PermissionDeniedError):
        tenant.completions.create(model="smol-alt", prompt="x", max_tokens=1)
    first = tenant.completions.with_raw_response.create(model="smol", prompt=SYSTEM, max_tokens=2)
    assert first.headers["x-ratelimit-remaining-tokens"] == "60"
    assert first.parse().usage.total_tokens > 30  # the long prompt uses up the 60 tokens per minute
    tenant.completions.create(model="smol", prompt=SYSTEM, max_tokens=2)
    with pytest.raises(openai.RateLimitError) as err:
        tenant.completions.create(model="smol", prompt="x", max_tokens=1)
    assert err.value.response.headers["x-ratelimit-remaining-tokens"] == "0"


def cache_hit_fraction(c: Cluster, strategy: str, tag: str) -> float:
    """Cached prompt tokens / prompt tokens over A and B for a shared-prefix workload under `strategy`."""
    c.set("smol", strategy=strategy)
    before = [
        (metric_sum(p.url, "sglang:cached_tokens_total"), metric_sum(p.url, "sglang:prompt_tokens_total"))
        for p in (c.a, c.b)
    ]
    client = c.client()
    for group in range(2):  # two tenants, each with its own long system prompt, three questions each
        prefix = f"[{tag} tenant {group}] " + SYSTEM
        for q in range(3):
            client.chat.completions.create(
                model="smol",
                max_tokens=1,
                temperature=0,
                messages=[
                    {"role": "system", "content": prefix},
                    {"role": "user", "content": f"Question {q}: where is it?"},
                ],
            )
    after = [
        (metric_sum(p.url, "sglang:cached_tokens_total"), metric_sum(p.url, "sglang:prompt_tokens_total"))
        for p in (c.a, c.b)
    ]
    cached = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    prompt = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    return cached / prompt


def test_prefix_aware_routing_beats_round_robin_on_cache_hits(cluster):
    round_robin = cache_hit_fraction(cluster, "roundRobin", "rr")
    prefix = cache_hit_fraction(cluster, "prefixHash", "ph")
    # prefix hash: each tenant's 2nd and 3rd request hit; round robin alternates backends, so only the 3rd does
    assert prefix > round_robin + 0.15, (prefix, round_robin)
    assert prefix > 0.3


def test_a_killed_backend_is_routed_around(cluster):
    c = cluster
    c.set("smol", strategy="roundRobin")
    client = c.client()
    client.completions.create(model="smol", prompt="Warm", max_tokens=1)
    c.b.proc.terminate()  # the pod goes away: its port stops answering, but discovery still lists it
    c.b.proc.wait(30)
    for i in range(4):
        raw = client.completions.with_raw_response.create(model="smol", prompt=f"Count {i}:", max_tokens=1)
        assert raw.headers["x-skiff-backend"] == c.a.address
    assert metric_sum(c.router.url, "skiff_router_retries_total") >= 1

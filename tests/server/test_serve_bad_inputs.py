"""Every bad request gets a 4xx OpenAI-style JSON error, and the server keeps serving correctly after."""

from __future__ import annotations

import httpx
import openai
import pytest
from support.serve import API_KEY, ServerProcess

M = "SmolLM2-135M-Instruct"
USER = [{"role": "user", "content": "Hi"}]
C, CHAT = "/v1/completions", "/v1/chat/completions"

# (name, path, json body or raw bytes, expected status)
CASES: list[tuple[str, str, object, int]] = [
    ("invalid json", C, b'{"prompt": "hi", ', 400),
    ("invalid json chat", CHAT, b"not json at all", 400),
    ("body is an array", C, b'["hi"]', 400),
    ("bad utf-8", C, b'{"prompt": "\xff\xfe caf\xe9"}', 400),
    ("missing prompt", C, {"model": M}, 400),
    ("missing messages", CHAT, {"model": M}, 400),
    ("empty messages", CHAT, {"model": M, "messages": []}, 400),
    ("bad role", CHAT, {"model": M, "messages": [{"role": "wizard", "content": "hi"}]}, 400),
    ("content wrong type", CHAT, {"model": M, "messages": [{"role": "user", "content": 42}]}, 400),
    ("user without content", CHAT, {"model": M, "messages": [{"role": "user"}]}, 400),
    (
        "image part",
        CHAT,
        {
            "model": M,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}],
                }
            ],
        },
        400,
    ),
    ("prompt wrong type", C, {"model": M, "prompt": 12}, 400),
    ("empty prompt", C, {"model": M, "prompt": ""}, 400),
    ("empty prompt list", C, {"model": M, "prompt": []}, 400),
    ("token id out of vocab", C, {"model": M, "prompt": [1, 2, 10_000_000]}, 400),
    ("max_tokens negative", C, {"model": M, "prompt": "hi", "max_tokens": -1}, 400),
    ("max_tokens zero", C, {"model": M, "prompt": "hi", "max_tokens": 0}, 400),
    ("max_tokens string", C, {"model": M, "prompt": "hi", "max_tokens": "ten"}, 400),
    ("max_tokens huge", C, {"model": M, "prompt": "hi", "max_tokens": 10**9}, 400),
    ("max_completion_tokens huge", CHAT, {"model": M, "messages": USER, "max_completion_tokens": 10**7}, 400),
    ("prompt over the context", C, {"model": M, "prompt": [1] * 9000, "max_tokens": 1}, 400),
    ("temperature negative", C, {"model": M, "prompt": "hi", "temperature": -1}, 400),
    ("temperature too high", CHAT, {"model": M, "messages": USER, "temperature": 5}, 400),
    ("top_p zero", C, {"model": M, "prompt": "hi", "top_p": 0}, 400),
    ("top_p above one", CHAT, {"model": M, "messages": USER, "top_p": 1.5}, 400),
    ("top_k below -1", C, {"model": M, "prompt": "hi", "top_k": -5}, 400),
    ("min_p above one", C, {"model": M, "prompt": "hi", "min_p": 2}, 400),
    ("presence_penalty out of range", CHAT, {"model": M, "messages": USER, "presence_penalty": 3}, 400),
    ("frequency_penalty out of range", C, {"model": M, "prompt": "hi", "frequency_penalty": -3}, 400),
    ("repetition_penalty zero", C, {"model": M, "prompt": "hi", "repetition_penalty": 0}, 400),
    ("n zero", C, {"model": M, "prompt": "hi", "n": 0}, 400),
    ("n too large", CHAT, {"model": M, "messages": USER, "n": 1000}, 400),
    ("unknown parameter", C, {"model": M, "prompt": "hi", "frobnicate": True}, 400),
    ("unknown parameter chat", CHAT, {"model": M, "messages": USER, "temprature": 0.5}, 400),
    ("unknown model", CHAT, {"model": "gpt-17", "messages": USER}, 404),
    ("too many stop strings", C, {"model": M, "prompt": "hi", "stop": [str(i) for i in range(20)]}, 400),
    ("empty stop string", C, {"model": M, "prompt": "hi", "stop": [""]}, 400),
    ("logprobs too many", C, {"model": M, "prompt": "hi", "logprobs": 50}, 400),
    (
        "top_logprobs too many",
        CHAT,
        {"model": M, "messages": USER, "logprobs": True, "top_logprobs": 30},
        400,
    ),
    ("top_logprobs without logprobs", CHAT, {"model": M, "messages": USER, "top_logprobs": 2}, 400),
    ("stream wrong type", C, {"model": M, "prompt": "hi", "stream": "yes"}, 400),
    (
        "stream_options without stream",
        C,
        {"model": M, "prompt": "hi", "stream_options": {"include_usage": True}},
        400,
    ),
    ("seed wrong type", C, {"model": M, "prompt": "hi", "seed": "abc"}, 400),
    (
        "tool of another type",
        CHAT,
        {"model": M, "messages": USER, "tools": [{"type": "retrieval", "function": {"name": "f"}}]},
        400,
    ),
    ("logit_bias", C, {"model": M, "prompt": "hi", "logit_bias": {"50256": -100}}, 400),
    (
        "schema that does not compile",
        CHAT,
        {
            "model": M,
            "messages": USER,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "objekt"}},
            },
        },
        400,
    ),
    (
        "json_schema format without its schema object",
        CHAT,
        {"model": M, "messages": USER, "response_format": {"type": "json_schema"}},
        400,
    ),
    (
        "unknown response format",
        CHAT,
        {"model": M, "messages": USER, "response_format": {"type": "yaml"}},
        400,
    ),
    ("regex that does not compile", C, {"model": M, "prompt": "hi", "regex": "[a-"}, 400),
    ("ebnf that does not parse", C, {"model": M, "prompt": "hi", "ebnf": 'root ::= "a'}, 400),
    ("json_schema field not JSON", C, {"model": M, "prompt": "hi", "json_schema": "{type"}, 400),
    ("two grammars", C, {"model": M, "prompt": "hi", "regex": "a+", "ebnf": 'root ::= "a"'}, 400),
]


@pytest.fixture(scope="module")
def http(server: ServerProcess):
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as c:
        yield c


def assert_openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    assert "code" in err and "param" in err
    return err


@pytest.mark.parametrize(("name", "path", "body", "status"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_rejected(http: httpx.Client, name: str, path: str, body: object, status: int) -> None:
    if isinstance(body, bytes):
        r = http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = http.post(path, json=body)
    assert_openai_error(r, status)


def test_auth_size_and_routes(server: ServerProcess, http: httpx.Client) -> None:
    body = {"model": M, "prompt": "hi", "max_tokens": 1}
    err = assert_openai_error(
        httpx.post(server.url + C, json=body, headers={"Authorization": "Bearer nope"}), 401
    )
    assert err["code"] == "invalid_api_key"
    assert_openai_error(httpx.post(server.url + C, json=body), 401)
    assert_openai_error(httpx.get(server.url + "/v1/models"), 401)
    huge = {"model": M, "prompt": "x" * (2 * 1024 * 1024)}  # the test server allows 1 MiB
    assert_openai_error(http.post(C, json=huge), 413)
    assert_openai_error(http.get(C), 405)
    assert_openai_error(http.get("/v1/nothing-here"), 404)
    assert_openai_error(http.get("/v1/models/gpt-17"), 404)
    # the official client surfaces these as typed exceptions with the server's message
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=M, messages=USER, temperature=9)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-17", messages=USER)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_still_serving_after_bad_inputs(server: ServerProcess, client: openai.OpenAI) -> None:
    for _, path, body, _ in CASES:  # the whole barrage again, then a real request
        if isinstance(body, bytes):
            httpx.post(server.url + path, content=body, headers=server.headers)
        else:
            httpx.post(server.url + path, json=body, headers=server.headers)
    r = client.chat.completions.create(
        model=M,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=20,
    )
    assert "Paris" in r.choices[0].message.content
    assert httpx.get(server.url + "/health").status_code == 200
    assert server.integrity()["ok"]

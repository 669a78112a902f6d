"""A small OpenAI-shaped backend, to serve over real HTTP with support.asgi.ServerThread.

The fake backend answers with its own name so tests can see where a request went; the integration tests
in test_router_serve.py use real `skiff serve` processes instead.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


def fake_backend(
    name: str, chunk_delay: float = 0.0, die_after_chunks: int | None = None, api_key: str | None = None
) -> FastAPI:
    """Completions echo `<name>:<prompt>`; usage counts prompt words and max_tokens; streams emit max_tokens
    chunks `chunk_delay` apart (and stop dead after `die_after_chunks`, to play a crash)."""
    app = FastAPI()
    app.state.requests = []

    def usage(prompt: str, n: int) -> dict:
        p = len(prompt.split())
        return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}

    @app.post("/v1/completions")
    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
            return JSONResponse({"error": {"message": "bad key", "code": "invalid_api_key"}}, status_code=401)
        body = await request.json()
        app.state.requests.append(body)
        chat = "messages" in body
        prompt = body["messages"][-1]["content"] if chat else body.get("prompt", "")
        n = int(body.get("max_tokens") or 4)
        if not body.get("stream"):
            choice = (
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"{name}:{prompt}"},
                    "finish_reason": "length",
                }
                if chat
                else {"index": 0, "text": f"{name}:{prompt}", "finish_reason": "length"}
            )
            return JSONResponse(
                {
                    "id": "x",
                    "object": "chat.completion" if chat else "text_completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [choice],
                    "usage": usage(prompt, n),
                }
            )

        async def events():
            for i in range(n):
                if die_after_chunks is not None and i >= die_after_chunks:
                    raise RuntimeError("backend crashed")
                await asyncio.sleep(chunk_delay)
                choice = (
                    {"index": 0, "delta": {"content": f"{name}{i} "}, "finish_reason": None}
                    if chat
                    else {"index": 0, "text": f"{name}{i} ", "finish_reason": None}
                )
                chunk = {
                    "id": "x",
                    "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [choice],
                }
                yield f"data: {json.dumps(chunk)}\n\n"
            if (body.get("stream_options") or {}).get("include_usage"):
                yield f"data: {json.dumps({'id': 'x', 'choices': [], 'usage': usage(prompt, n)})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app

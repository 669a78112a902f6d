"""The router's HTTP surface: OpenAI endpoints routed by `model`, /v1/models, /health, /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from skiff_router.balance import prefix_key
from skiff_router.discovery import Source
from skiff_router.hold import Holder, HoldRefused
from skiff_router.keys import ApiKey, AuthError, KeyStore, authenticate, authorize
from skiff_router.metrics import RouterMetrics
from skiff_router.proxy import NoEndpoint, Upstream, open_upstream, relay_sse
from skiff_router.registry import Pool, Registry

log = logging.getLogger("skiff_router")


@dataclass
class RouterConfig:
    hold_cap: int = 64  # requests held per model while it has no ready endpoint
    hold_timeout: float = 120.0  # seconds a held request waits before 503
    keepalive_interval: float = 5.0  # seconds between SSE progress comments while held
    retry_after: int = 10  # seconds advertised in Retry-After on 503
    max_attempts: int = 3  # endpoints tried before the first byte
    connect_timeout: float = 3.0
    require_api_key: bool = False  # True: every model needs a key; else only models with apiKeySecretRef
    quota_replicas: int = 1  # router replicas sharing each key's limits (kube discovery may update it)
    metrics_port: int | None = None  # /metrics on a listener of its own (create_metrics_app), not the API's


def error(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> JSONResponse:
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "invalid_request_error",
        429: "rate_limit_error",
    }.get(status, "server_error")
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": code}},
        status_code=status,
        headers=headers,
    )


def sse_error(status: int, message: str, code: str) -> bytes:
    body = {
        "error": {"message": message, "type": "server_error", "param": None, "code": code, "status": status}
    }
    return b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n"


class Router:
    def __init__(self, source: Source, config: RouterConfig) -> None:
        self.source, self.config = source, config
        self.registry, self.metrics = Registry(), RouterMetrics()
        self.keys = KeyStore(share=config.quota_replicas)
        self.holder = Holder(self.registry, source, self.metrics, config.hold_cap, config.hold_timeout)
        self.client: httpx.AsyncClient | None = None
        self.discovered = False
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=self.config.connect_timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
        await self._refresh()
        self._task = asyncio.create_task(self._discover())

    async def _refresh(self) -> None:
        try:
            await self.source.refresh(self.registry, self.keys)
            self.discovered = True
        except Exception as e:  # an unreachable API or a bad file must not kill the router
            log.warning("discovery failed: %s", e)

    async def _discover(self) -> None:
        while True:
            await asyncio.sleep(self.source.interval)
            await self._refresh()

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.client:
            await self.client.aclose()

    # --- request path ---------------------------------------------------------------------------------

    async def handle(self, request: Request, path: str) -> Response:
        arrived = time.monotonic()
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return error(400, "request body must be a JSON object", "invalid_json")
        if not isinstance(body, dict):
            return error(400, "request body must be a JSON object", "invalid_json")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return error(400, "`model` is required and must be a string", "missing_model")
        pool = self.registry.lookup(model)
        if pool is None:
            self.metrics.rejected.labels(model="", reason="unknown_model").inc()
            return error(
                404,
                f"The model `{model}` does not exist; available: {', '.join(self.registry.models())}",
                "model_not_found",
            )
        try:
            key, rl_headers = authorize(
                self.keys,
                request.headers.get("authorization"),
                model,
                required=self.config.require_api_key or pool.spec.upstream_key is not None,
                extra_allowed=frozenset({pool.spec.pod_key_name} if pool.spec.upstream_key else ()),
            )
        except AuthError as e:
            self.metrics.rejected.labels(model=model, reason=str(e.status)).inc()
            return error(e.status, e.message, e.code, e.headers)
        stream = body.get("stream") is True
        strip_usage = False
        if stream and not (body.get("stream_options") or {}).get("include_usage"):
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
            strip_usage = True
        routing_key = prefix_key(body, pool.spec.prefix_chars)
        ctx = _Ctx(model, path, body, routing_key, key, rl_headers, arrived, strip_usage)
        if stream and not pool.endpoints:
            if self.holder.held_for(model) >= self.config.hold_cap:  # refuse with a real 503 before the 200
                self.metrics.rejected.labels(model=model, reason="hold_cap").inc()
                return error(
                    503,
                    f"model {model!r} has no ready replica and {self.config.hold_cap} requests are "
                    "already waiting",
                    "hold_cap",
                    {"Retry-After": str(self.config.retry_after)} | rl_headers,
                )
            # held before any backend answers: the client gets 200 + SSE comments now, the backend's bytes later
            return StreamingResponse(
                self._held_stream(ctx), media_type="text/event-stream", headers=rl_headers
            )
        try:
            pool = await self.holder.wait(model)
        except HoldRefused as e:
            return error(503, str(e), e.code, {"Retry-After": str(self.config.retry_after)} | rl_headers)
        try:
            up = await self._open(pool, ctx)
        except NoEndpoint as e:
            return error(503, str(e), "upstream_unavailable", {"Retry-After": str(self.config.retry_after)})
        headers = rl_headers | {"x-skiff-backend": up.endpoint.address}
        if stream and up.response.status_code == 200:
            return StreamingResponse(self._relay(up, ctx), media_type="text/event-stream", headers=headers)
        return await self._whole(up, ctx, headers)

    async def _open(self, pool: Pool, ctx: _Ctx) -> Upstream:
        assert self.client is not None
        retries = self.metrics.retries.labels(model=ctx.model)
        up = await open_upstream(
            self.client,
            pool,
            ctx.path,
            ctx.body,
            ctx.routing_key,
            self.config.max_attempts,
            on_retry=retries.inc,
        )
        self.metrics.routed.labels(model=ctx.model, endpoint=up.endpoint.address).inc()
        self.metrics.inflight.labels(model=ctx.model).inc()
        self.metrics.ttfb.labels(model=ctx.model).observe(time.monotonic() - ctx.arrived)
        return up

    def _done(self, up: Upstream, ctx: _Ctx) -> None:
        up.endpoint.inflight -= 1
        self.metrics.inflight.labels(model=ctx.model).dec()
        self.metrics.responses.labels(model=ctx.model, code=str(up.response.status_code)).inc()
        self.metrics.tokens.labels(model=ctx.model, kind="prompt").inc(up.usage.prompt_tokens)
        self.metrics.tokens.labels(model=ctx.model, kind="completion").inc(up.usage.completion_tokens)
        if ctx.key is not None:
            self.keys.charge(ctx.key, up.usage.total)

    async def _whole(self, up: Upstream, ctx: _Ctx, headers: dict[str, str]) -> Response:
        try:
            content = await up.response.aread()
        finally:
            await up.response.aclose()
        with contextlib.suppress(ValueError, AttributeError):
            up.usage.take(json.loads(content).get("usage"))
        self._done(up, ctx)
        media = up.response.headers.get("content-type", "application/json")
        return Response(content, status_code=up.response.status_code, media_type=media, headers=headers)

    async def _relay(self, up: Upstream, ctx: _Ctx) -> AsyncIterator[bytes]:
        try:
            async for event in relay_sse(up, ctx.strip_usage):
                yield event
        except httpx.HTTPError as e:  # the backend died mid-stream: never retried, the client is told
            yield sse_error(
                502, f"backend {up.endpoint.address} failed mid-stream: {type(e).__name__}", "upstream_failed"
            )
        finally:
            self._done(up, ctx)

    async def _held_stream(self, ctx: _Ctx) -> AsyncIterator[bytes]:
        started = time.monotonic()
        waiter = asyncio.create_task(self.holder.wait(ctx.model))
        try:
            while True:
                done, _ = await asyncio.wait({waiter}, timeout=self.config.keepalive_interval)
                if done:
                    break
                yield self.holder.progress_comment(ctx.model, time.monotonic() - started)
            pool = waiter.result()
            up = await self._open(pool, ctx)
        except HoldRefused as e:
            yield sse_error(503, f"{e} (retry after {self.config.retry_after}s)", e.code)
            return
        except NoEndpoint as e:
            yield sse_error(503, str(e), "upstream_unavailable")
            return
        finally:
            if not waiter.done():
                waiter.cancel()
        if up.response.status_code != 200:
            content = await up.response.aread()
            await up.response.aclose()
            self._done(up, ctx)
            yield b"data: " + content + b"\n\ndata: [DONE]\n\n"
            return
        async for event in self._relay(up, ctx):
            yield event


@dataclass
class _Ctx:
    model: str
    path: str
    body: dict
    routing_key: str
    key: ApiKey | None
    rl_headers: dict[str, str]
    arrived: float
    strip_usage: bool = False


def create_app(source: Source, config: RouterConfig | None = None) -> FastAPI:
    router = Router(source, config or RouterConfig())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        await router.start()
        yield
        await router.stop()

    app = FastAPI(title="skiff router", lifespan=lifespan)
    app.state.router = router

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await router.handle(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await router.handle(request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        allowed = router.registry.models()
        try:
            key = authenticate(
                router.keys, request.headers.get("authorization"), required=router.config.require_api_key
            )
        except AuthError as e:
            return error(e.status, e.message, e.code, e.headers)
        if key is not None:
            allowed = [
                m for m in allowed if key.allows(m) or key.name == router.registry.lookup(m).spec.pod_key_name
            ]
        data = []
        for m in allowed:
            pool = router.registry.lookup(m)
            data.append(
                {
                    "id": m,
                    "object": "model",
                    "created": 0,
                    "owned_by": "skiff",
                    "ready_replicas": len(pool.endpoints) if pool else 0,
                }
            )
        return JSONResponse({"object": "list", "data": data})

    @app.get("/health")
    async def health() -> Response:
        if not router.discovered:
            return JSONResponse({"status": "starting"}, status_code=503)
        return JSONResponse({"status": "ok", "models": len(router.registry.models())})

    if router.config.metrics_port is None:
        app.add_api_route("/metrics", metrics_endpoint(router), methods=["GET"])
    return app


def metrics_endpoint(router: Router):
    async def metrics() -> Response:
        for m in router.registry.models():
            pool = router.registry.lookup(m)
            router.metrics.endpoints.labels(model=m).set(len(pool.endpoints) if pool else 0)
        return Response(router.metrics.render(), media_type="text/plain; version=0.0.4")

    return metrics


def create_metrics_app(app: FastAPI) -> FastAPI:
    """/metrics of the router `app` alone, for its own port (--metrics-port)."""
    side = FastAPI(title="skiff router metrics", docs_url=None, redoc_url=None, openapi_url=None)
    side.add_api_route("/metrics", metrics_endpoint(app.state.router), methods=["GET"])
    return side

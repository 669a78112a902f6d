"""The OpenAI-compatible HTTP API (FastAPI): routes, authentication, body limits and error mapping."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import time
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from skiff.constrained.grammar import Grammar, GrammarError, to_llguidance
from skiff.params import InvalidRequest, SamplingParams
from skiff.server.args import ServerArgs
from skiff.server.auth import KeyRing
from skiff.server.chat_output import ChatOutputSpec
from skiff.server.engine_client import EngineClient
from skiff.server.errors import ApiError, error_body, from_validation
from skiff.server.generation import Job
from skiff.server.messages import ChatPrompt, DecodeOptions, TokenIdsPrompt
from skiff.server.openai_types import ChatCompletionRequest, CompletionRequest
from skiff.server.tool_choice import check_tools, forced_schema

M = TypeVar("M", bound=BaseModel)
_OPEN_PATHS = {"/health", "/health_generate", "/metrics", "/skiff/integrity", "/skiff/processes"}
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
HEALTH_GENERATE_TIMEOUT = 30.0


async def read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(
            413, f"request body too large: {length} bytes, the limit is {limit}", code="body_too_large"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body too large: the limit is {limit} bytes", code="body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def parse(request: Request, model: type[M], limit: int) -> M:
    body = await read_body(request, limit)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"request body is not valid UTF-8: {e}", code="invalid_encoding") from e
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ApiError(400, f"request body is not valid JSON: {e}", code="invalid_json") from e
    if not isinstance(obj, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate_json(text)
    except ValidationError as e:
        raise from_validation(e) from e


def sampling_params(fields: dict[str, Any]) -> SamplingParams:
    try:
        return SamplingParams(**fields)
    except InvalidRequest as e:
        raise ApiError(400, str(e)) from e


def checked_grammar(grammar: Grammar | None) -> Grammar | None:
    """A grammar that compiles, or a 400 naming the problem: before any token is generated."""
    if grammar is not None:
        try:
            to_llguidance(grammar)
        except GrammarError as e:
            param = "response_format" if grammar.kind == "json_schema" else grammar.kind
            raise ApiError(400, str(e), param=param, code="invalid_grammar") from e
    return grammar


async def _until_disconnect(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


def metrics_endpoint(client: EngineClient) -> Any:
    async def metrics() -> Response:
        return Response(client.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return metrics


def create_metrics_app(client: EngineClient) -> FastAPI:
    """`--metrics-port`: /metrics alone, on a port of its own."""
    app = FastAPI(title="Skiff metrics", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_api_route("/metrics", metrics_endpoint(client), methods=["GET"])
    return app


def create_app(args: ServerArgs, client: EngineClient) -> FastAPI:
    app = FastAPI(title="Skiff", docs_url=None, redoc_url=None, openapi_url=None)
    model_name = args.model_name
    keys = KeyRing.configured(args.api_key, args.api_key_file)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, e: ApiError) -> JSONResponse:
        client.metrics.errors.labels(model_name=model_name, status=str(e.status)).inc()
        return e.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        message = "Not found" if e.status_code == 404 else str(e.detail)
        return JSONResponse(error_body(e.status_code, message), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _internal(_: Request, e: Exception) -> JSONResponse:
        return JSONResponse(error_body(500, f"internal error: {type(e).__name__}: {e}"), status_code=500)

    @app.middleware("http")
    async def _auth(request: Request, call_next: Any) -> Response:
        if keys.required and request.url.path not in _OPEN_PATHS:
            header = request.headers.get("authorization", "")
            given = header[7:] if header.lower().startswith("bearer ") else ""
            if not keys.accepts(given):
                client.metrics.errors.labels(model_name=model_name, status="401").inc()
                return ApiError(401, "Incorrect API key provided.", code="invalid_api_key").response()
        return await call_next(request)

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise ApiError(404, f"The model `{name}` does not exist.", param="model", code="model_not_found")

    def check_serving() -> None:
        problem = client.health_problem()
        if problem:
            raise ApiError(503, f"server unavailable: {problem}", code="unavailable")

    def request_id(request: Request) -> str | None:
        rid = request.headers.get("x-request-id")
        return rid if rid and _REQUEST_ID.match(rid) else None

    async def respond(request: Request, job: Job, stream: bool, include_usage: bool) -> Response:
        headers = {"x-request-id": job.id}
        if stream:
            return StreamingResponse(
                job.stream(include_usage), media_type="text/event-stream", headers=headers
            )
        collect = asyncio.ensure_future(job.collect())
        gone = asyncio.ensure_future(_until_disconnect(request))
        done, _ = await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
        if collect not in done:  # the client left: stop generating for it
            collect.cancel()
            job.abort()
            return Response(status_code=499)
        gone.cancel()
        return JSONResponse(collect.result(), headers=headers)

    def check_n(n: int, prompts: int) -> None:
        if n * prompts > args.max_n:
            raise ApiError(400, f"n x prompts must be at most {args.max_n}, got {n * prompts}", param="n")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = await parse(request, CompletionRequest, args.max_body_bytes)
        check_model(req.model)
        check_serving()
        prompts = req.prompts()
        check_n(req.n, len(prompts))
        sampling = sampling_params(
            req.base_params()
            | {"seed": req.seed, "logprobs": req.logprobs is not None, "top_logprobs": req.logprobs or 0}
            | {"grammar": checked_grammar(req.grammar())}
        )
        decode = DecodeOptions(req.stop_list(), req.skip_special_tokens, req.logprobs is not None)
        job = Job(
            client, False, model_name, prompts, sampling, req.max_tokens, req.n, decode, request_id(request)
        )
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return await respond(request, job, req.stream, include_usage)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req = await parse(request, ChatCompletionRequest, args.max_body_bytes)
        check_model(req.model)
        check_serving()
        check_n(req.n, 1)
        messages = [m.for_template() for m in req.messages]
        template_kwargs = dict(req.chat_template_kwargs or {})
        if not req.add_generation_prompt:
            template_kwargs["add_generation_prompt"] = False
        output, grammar = chat_output(req)
        if req.tools and req.effective_tool_choice() != "none":
            template_kwargs["tools"] = req.tools
        prompt = ChatPrompt(messages, template_kwargs)
        sampling = sampling_params(
            req.base_params()
            | {"seed": req.seed, "logprobs": req.logprobs, "top_logprobs": req.top_logprobs or 0}
            | {"grammar": checked_grammar(grammar)}
        )
        decode = DecodeOptions(req.stop_list(), req.skip_special_tokens, req.logprobs)
        budget = req.completion_budget()
        rid = request_id(request)
        job = Job(client, True, model_name, [prompt], sampling, budget, req.n, decode, rid, output)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return await respond(request, job, req.stream, include_usage)

    def chat_output(req: ChatCompletionRequest) -> tuple[ChatOutputSpec, Grammar | None]:
        """How the answer is shaped (reasoning, tool calls) and the grammar it must match, if any."""
        choice = req.effective_tool_choice()
        try:
            check_tools(req.tools, choice)
        except ValueError as e:
            raise ApiError(400, str(e), param="tools") from e
        names = tuple(t["function"]["name"] for t in req.tools or ())
        grammar = req.grammar()
        forced = choice if choice == "required" or isinstance(choice, dict) else None
        if forced is not None:
            if grammar is not None:
                raise ApiError(
                    400, "a forced tool_choice and a grammar cannot be combined", param="tool_choice"
                )
            schema = forced_schema(req.tools or [], forced, parallel=req.parallel_tool_calls is not False)
            grammar = Grammar("json_schema", json.dumps(schema))
        info = client.info
        spec = ChatOutputSpec(
            reasoning_parser=info.reasoning_parser if req.separate_reasoning else None,
            tool_parser=info.tool_parser if choice == "auto" else None,
            tool_names=names,
            forced_choice=forced,
        )
        return spec, grammar

    def model_card() -> dict[str, Any]:
        return {
            "id": model_name,
            "object": "model",
            "created": int(app.state.started),
            "owned_by": "skiff",
            "root": model_name,
            "max_model_len": client.info.max_context_len,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> dict[str, Any]:
        check_model(name)
        return model_card()

    @app.get("/health")
    async def health() -> Response:
        problem = client.health_problem()
        if problem:
            return JSONResponse(error_body(503, problem, code="unhealthy"), status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/health_generate")
    async def health_generate() -> Response:
        check_serving()
        job = Job(
            client,
            False,
            model_name,
            [TokenIdsPrompt(client.info.probe_ids)],
            SamplingParams(temperature=0.0, ignore_eos=True),
            1,
            1,
            DecodeOptions(),
            "health-" + str(time.time_ns()),
        )
        try:
            body = await asyncio.wait_for(job.collect(), HEALTH_GENERATE_TIMEOUT)
        except TimeoutError:
            job.abort()
            raise ApiError(503, "generation did not finish in time", code="unhealthy") from None
        return JSONResponse({"status": "ok", "completion_tokens": body["usage"]["completion_tokens"]})

    if args.metrics_port is None:
        app.add_api_route("/metrics", metrics_endpoint(client), methods=["GET"])

    @app.get("/skiff/integrity")
    async def integrity() -> Response:
        """KV page accounting, checked by the engine itself (free + cached + used == total)."""
        check_serving()
        report = await client.check_integrity()
        stats = dataclasses.asdict(report.stats)
        body = {"ok": report.ok, "error": report.error, "stats": stats, "live": report.live}
        return JSONResponse(body, status_code=200 if report.ok else 500)

    @app.get("/skiff/processes")
    async def processes() -> dict[str, Any]:
        ranks = {f"tp-rank-{i + 1}": pid for i, pid in enumerate(client.info.rank_pids)}
        return {"api": os.getpid(), **client.info.pids, **ranks}

    app.state.started = time.time()
    return app

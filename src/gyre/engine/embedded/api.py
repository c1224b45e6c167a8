"""SGLang's native HTTP API in front of an ``EmbeddedEngine`` (Starlette on uvicorn).

Every 4xx/5xx body is ``{"error": {"message", "type", "code"}}``; a bad request never disturbs other requests.
Gyre extensions live under ``/gyre/``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from gyre.config import EngineConfig
from gyre.engine.embedded.asyncengine import EmbeddedEngine
from gyre.engine.http import sse_event
from gyre.errors import ConfigError, EngineRequestError, GyreError, ProtocolError
from gyre.protocol import (
    AbortRequest,
    ExportKVRequest,
    GenerateRequest,
    GenerateResponse,
    InitWeightsUpdateGroupRequest,
    MemoryRequest,
    PauseGenerationRequest,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
    decode_json,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_BODY_BYTES = 256 * 2**20  # a KV import of a long prefix is the largest body


def _json(data: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(data), status_code=status, media_type="application/json")


def error_response(message: str, status: int) -> Response:
    """The JSON error body every failure gets."""
    kind = {400: "BadRequestError", 404: "NotFoundError", 409: "ConflictError", 413: "RequestTooLarge"}
    body = {"error": {"message": message, "type": kind.get(status, "ServerError"), "code": status}}
    return _json(body, status)


async def _body(request: Request, type_: type[T], what: str, default_empty: bool = False) -> T:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise EngineRequestError(f"the body has {len(raw)} bytes; the limit is {MAX_BODY_BYTES}", status=413)
    if not raw.strip() and default_empty:
        raw = b"{}"
    try:
        return decode_json(raw, type_, what)
    except ProtocolError as exc:
        raise EngineRequestError(str(exc)) from None


def _handler(fn: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """Map Gyre errors to JSON 4xx bodies and anything unexpected to a logged JSON 500."""

    async def wrapped(request: Request) -> Response:
        try:
            return await fn(request)
        except EngineRequestError as exc:
            return error_response(str(exc), exc.status)
        except (ConfigError, ProtocolError) as exc:
            return error_response(str(exc), 400)
        except GyreError as exc:
            return error_response(str(exc), 500)
        except Exception as exc:
            log.exception("unexpected error in %s", request.url.path)
            return error_response(f"internal error: {exc!r}", 500)

    return wrapped


def build_app(engine: EmbeddedEngine) -> Starlette:
    """The ASGI application serving ``engine``."""

    async def generate(request: Request) -> Response:
        body = await _body(request, GenerateRequest, "generate request")
        if not body.stream:
            return _json(await engine.generate(body))
        stream: AsyncGenerator[GenerateResponse, None] = engine.generate_stream(body)
        first = await anext(stream)  # validation errors surface as a 4xx before the stream starts

        async def events() -> AsyncIterator[bytes]:
            try:
                yield sse_event(msgspec.json.encode(first))
                async for chunk in stream:
                    yield sse_event(msgspec.json.encode(chunk))
            except GyreError as exc:
                err = {"error": {"message": str(exc), "type": "ServerError", "code": 500}}
                yield sse_event(msgspec.json.encode(err))
            finally:
                await stream.aclose()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def abort_request(request: Request) -> Response:
        body = await _body(request, AbortRequest, "abort request", default_empty=True)
        if not body.rid and not body.abort_all:
            raise EngineRequestError("give a rid or set abort_all")
        await engine.abort(body.rid, body.abort_all)
        return Response(status_code=200)

    async def pause_generation(request: Request) -> Response:
        body = await _body(request, PauseGenerationRequest, "pause request", default_empty=True)
        await engine.pause(body.mode)
        return _json({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(request: Request) -> Response:
        await engine.continue_generation()
        return _json({"message": "Generation continued successfully.", "status": "ok"})

    async def flush_cache(request: Request) -> Response:
        freed = await engine.flush_cache()
        return PlainTextResponse(
            f"Cache flushed.\nFreed {freed} cached tokens; tokens of running requests stay.\n"
        )

    async def release_memory(request: Request) -> Response:
        body = await _body(request, MemoryRequest, "release request", default_empty=True)
        await engine.release_memory(list(body.tags) if body.tags else None)
        return _json(None)

    async def resume_memory(request: Request) -> Response:
        body = await _body(request, MemoryRequest, "resume request", default_empty=True)
        await engine.resume_memory(list(body.tags) if body.tags else None)
        return _json(None)

    async def update_from_disk(request: Request) -> Response:
        body = await _body(request, UpdateWeightsFromDiskRequest, "update_weights_from_disk request")
        try:
            version = await engine.update_weights_from_disk(body)
        except (ConfigError, EngineRequestError) as exc:
            return _json({"success": False, "message": str(exc)}, 400)
        return _json(
            {"success": True, "message": f"Succeeded to update model weights. Weight version {version}."}
        )

    async def init_group(request: Request) -> Response:
        body = await _body(request, InitWeightsUpdateGroupRequest, "init_weights_update_group request")
        try:
            await engine.init_weights_update_group(body)
        except Exception as exc:
            return _json(
                {"success": False, "message": f"Failed to initialize custom process group: {exc}"}, 400
            )
        return _json({"success": True, "message": "Succeeded to initialize custom process group."})

    async def update_distributed(request: Request) -> Response:
        body = await _body(
            request, UpdateWeightsFromDistributedRequest, "update_weights_from_distributed request"
        )
        try:
            version = await engine.update_weights_from_distributed(body)
        except (ConfigError, EngineRequestError) as exc:
            return _json({"success": False, "message": str(exc)}, 400)
        return _json(
            {"success": True, "message": f"Succeeded to update parameter online. Weight version {version}."}
        )

    async def weight_update_bracket(request: Request) -> Response:
        # SGLang >= 0.5.22 requires begin/end around distributed updates; the embedded engine needs neither.
        return _json({"success": True, "message": ""})

    async def get_weight_version(request: Request) -> Response:
        return _json({"weight_version": str(engine.weight_version)})

    async def model_info(request: Request) -> Response:
        return _json(engine.model_info())

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def statistics(request: Request) -> Response:
        return _json(engine.statistics())

    async def export_kv(request: Request) -> Response:
        body = await _body(request, ExportKVRequest, "export_kv request")
        data = await engine.export_kv(body.input_ids)
        return Response(data, media_type="application/octet-stream")

    async def import_kv(request: Request) -> Response:
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            raise EngineRequestError(
                f"the body has {len(raw)} bytes; the limit is {MAX_BODY_BYTES}", status=413
            )
        return _json({"cached_tokens": await engine.import_kv(raw)})

    routes = [
        ("/generate", generate, ["POST", "PUT"]),
        ("/abort_request", abort_request, ["POST"]),
        ("/pause_generation", pause_generation, ["POST"]),
        ("/continue_generation", continue_generation, ["POST"]),
        ("/flush_cache", flush_cache, ["GET", "POST"]),
        ("/release_memory_occupation", release_memory, ["GET", "POST"]),
        ("/resume_memory_occupation", resume_memory, ["GET", "POST"]),
        ("/update_weights_from_disk", update_from_disk, ["POST"]),
        ("/init_weights_update_group", init_group, ["POST"]),
        ("/update_weights_from_distributed", update_distributed, ["POST"]),
        ("/begin_weight_update", weight_update_bracket, ["POST"]),
        ("/end_weight_update", weight_update_bracket, ["POST"]),
        ("/get_weight_version", get_weight_version, ["GET"]),
        ("/get_model_info", model_info, ["GET"]),
        ("/model_info", model_info, ["GET"]),
        ("/health", health, ["GET"]),
        ("/health_generate", health, ["GET"]),
        ("/gyre/statistics", statistics, ["GET"]),
        ("/gyre/export_kv", export_kv, ["POST"]),
        ("/gyre/import_kv", import_kv, ["POST"]),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(f"no such endpoint: {request.method} {request.url.path}", 404)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return error_response(f"{request.method} is not allowed on {request.url.path}", 405)

    return Starlette(
        routes=[Route(path, _handler(fn), methods=methods) for path, fn, methods in routes],
        exception_handlers={404: not_found, 405: not_allowed},
    )


def run_engine_server(cfg: EngineConfig) -> None:
    """Entry point of ``gyre serve-engine``: load the model, then serve until interrupted."""
    import uvicorn

    engine = EmbeddedEngine(cfg)
    app = build_app(engine)
    config = uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        loop="uvloop",
        log_level="warning",
        timeout_graceful_shutdown=2,
        timeout_keep_alive=300,  # longer than clients keep idle connections (httpx: 5 s): none is reused closed
    )
    server = uvicorn.Server(config)
    log.info("embedded engine serving %s on http://%s:%d", cfg.model_path, cfg.host, cfg.port)
    try:
        asyncio.run(server.serve())
    finally:
        engine.close()

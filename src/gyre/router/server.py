"""HTTP faces of the router: the agent-facing OpenAI API and, on another port, the admin API.

Agent-facing (``router.host:router.port``):
  ``/s/{token}/v1/...`` or ``/v1/...`` with ``Authorization: Bearer {token}``; the role comes from
  ``/s/{token}/{role}/v1/...`` or the ``X-Gyre-Role`` header (default ``main``).
  ``POST chat/completions``, ``POST completions``, ``GET models``, ``GET gyre/records`` (this session's only).
Admin (127.0.0.1:``router.admin_port``): sessions, engines (add, drain, resume, remove), statistics.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from gyre.errors import EngineRequestError, GyreError
from gyre.records import Role
from gyre.router.core import ROLES, Router
from gyre.router.openai_types import ChatRequest, CompletionRequest, RouterError

log = logging.getLogger(__name__)
T = TypeVar("T")
Handler = Callable[[Request], Awaitable[Response]]


def _json(data: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(data), status_code=status, media_type="application/json")


def _guard(fn: Handler) -> Handler:
    """Every failure becomes an OpenAI-style error body; nothing escapes as a bare 500."""

    async def wrapped(request: Request) -> Response:
        try:
            return await fn(request)
        except RouterError as exc:
            return _json(exc.body(), exc.status)
        except EngineRequestError as exc:
            return _json(RouterError(str(exc), exc.status).body(), exc.status)
        except GyreError as exc:
            return _json(RouterError(str(exc), 500, "server_error").body(), 500)
        except Exception as exc:
            log.exception("unexpected error in %s", request.url.path)
            return _json(RouterError(f"internal error: {exc!r}", 500, "server_error").body(), 500)

    return wrapped


async def _body(request: Request, type_: type[T], limit: int) -> T:
    raw = await request.body()
    if len(raw) > limit:
        raise RouterError(f"the request body has {len(raw)} bytes; the limit is {limit}", 413)
    try:
        return msgspec.json.decode(raw, type=type_)
    except msgspec.ValidationError as exc:
        raise RouterError(f"invalid request: {exc}", 400) from None
    except msgspec.DecodeError as exc:
        raise RouterError(f"the body is not valid JSON: {exc}", 400) from None


def _session_and_role(request: Request) -> tuple[str, Role]:
    token = request.path_params.get("token")
    if token is None:
        auth = request.headers.get("authorization", "")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise RouterError("missing session: use /s/{token}/v1 or Authorization: Bearer {token}", 401,
                              "authentication_error")  # fmt: skip
        token = value.strip()
    role = request.path_params.get("role") or request.headers.get("x-gyre-role") or "main"
    if role not in ROLES:
        raise RouterError(f"unknown role {role!r}; roles: {sorted(ROLES)}", 400, param="role")
    return token, role  # type: ignore[return-value]


def build_agent_app(router: Router) -> Starlette:
    """The agent-facing OpenAI-compatible application."""
    limit = int(router.cfg.max_body_mib * 2**20)

    async def chat(request: Request) -> Response:
        token, role = _session_and_role(request)
        router.session(token)  # 401 before parsing anything
        req = await _body(request, ChatRequest, limit)
        if not req.stream:
            return _json(await router.chat(token, req, role))
        chunks = router.chat_stream(token, req, role)
        first = await anext(chunks)  # errors surface as a status code before the stream starts

        async def events() -> AsyncIterator[bytes]:
            yield b"data: " + msgspec.json.encode(first) + b"\n\n"
            try:
                async for chunk in chunks:
                    yield b"data: " + msgspec.json.encode(chunk) + b"\n\n"
            except GyreError as exc:
                err = RouterError(str(exc), 500, "server_error").body()
                yield b"data: " + msgspec.json.encode(err) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def completions(request: Request) -> Response:
        token, role = _session_and_role(request)
        router.session(token)
        req = await _body(request, CompletionRequest, limit)
        if req.stream:
            raise RouterError(
                "streaming completions are not supported; use chat/completions", 422, param="stream"
            )
        return _json(await router.complete(token, req, role))

    async def models(request: Request) -> Response:
        token, _ = _session_and_role(request)
        router.session(token)
        model = {"id": router.model_name, "object": "model", "created": 0, "owned_by": "gyre"}
        return _json({"object": "list", "data": [model]})

    async def records(request: Request) -> Response:
        token, _ = _session_and_role(request)
        return _json({"records": router.records(token)})

    async def health(request: Request) -> Response:
        return _json({"status": "ok", "engines": router.pool.statistics().engines})

    routes: list[Route] = [Route("/health", health, methods=["GET"])]
    for prefix in ("/s/{token}/v1", "/s/{token}/{role}/v1", "/v1"):
        routes += [
            Route(prefix + "/chat/completions", _guard(chat), methods=["POST"]),
            Route(prefix + "/completions", _guard(completions), methods=["POST"]),
            Route(prefix + "/models", _guard(models), methods=["GET"]),
            Route(prefix + "/gyre/records", _guard(records), methods=["GET"]),
        ]
    return Starlette(routes=routes, exception_handlers=_http_errors())


def build_admin_app(router: Router) -> Starlette:
    """Sessions, engines and statistics: for the driver and operators, never for agents."""

    async def open_session(request: Request) -> Response:
        raw = await request.body()
        data = msgspec.json.decode(raw) if raw.strip() else {}
        token = router.open_session(data.get("execution_id") if isinstance(data, dict) else None)
        host, port = router.cfg.host, router.cfg.port
        return _json({"token": token, "base_url": f"http://{host}:{port}/s/{token}/v1"})

    async def close_session(request: Request) -> Response:
        if router.sessions.close(request.path_params["token"]) is None:
            raise RouterError("unknown session token", 404, "not_found_error")
        return _json({"closed": True})

    async def session_records(request: Request) -> Response:
        session = router.sessions.get(request.path_params["token"])
        if session is None:
            raise RouterError("unknown session token", 404, "not_found_error")
        return _json({"records": session.records})

    async def engines(request: Request) -> Response:
        return _json(router.pool.statistics())

    async def add_engine(request: Request) -> Response:
        data = msgspec.json.decode(await request.body())
        if not isinstance(data, dict) or not isinstance(data.get("url"), str):
            raise RouterError('body must be {"url": "http://host:port", "name": optional}', 400)
        engine = router.pool.add(data["url"], data.get("name"))
        return _json({"name": engine.name, "url": engine.url})

    async def drain(request: Request) -> Response:
        await router.pool.drain(request.path_params["name"])
        return _json(router.pool.statistics())

    async def resume(request: Request) -> Response:
        router.pool.resume(request.path_params["name"])
        return _json(router.pool.statistics())

    async def remove(request: Request) -> Response:
        await router.pool.remove(request.path_params["name"])
        return _json(router.pool.statistics())

    routes = [
        Route("/admin/sessions", _guard(open_session), methods=["POST"]),
        Route("/admin/sessions/{token}", _guard(close_session), methods=["DELETE"]),
        Route("/admin/sessions/{token}/records", _guard(session_records), methods=["GET"]),
        Route("/admin/engines", _guard(engines), methods=["GET"]),
        Route("/admin/engines", _guard(add_engine), methods=["POST"]),
        Route("/admin/engines/{name}/drain", _guard(drain), methods=["POST"]),
        Route("/admin/engines/{name}/resume", _guard(resume), methods=["POST"]),
        Route("/admin/engines/{name}", _guard(remove), methods=["DELETE"]),
    ]
    return Starlette(routes=routes, exception_handlers=_http_errors())


def _http_errors() -> dict[Any, Callable[[Request, Exception], Awaitable[Response]]]:
    async def not_found(request: Request, exc: Exception) -> Response:
        return _json(RouterError(f"no such path: {request.url.path}", 404, "not_found_error").body(), 404)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        err = RouterError(
            f"{request.method} is not allowed on {request.url.path}", 405, "invalid_request_error"
        )
        return _json(err.body(), 405)

    return {404: not_found, 405: not_allowed}


async def serve_router(router: Router) -> None:
    """Serve both applications until cancelled (agent-facing and admin, one event loop)."""
    import asyncio

    import uvicorn

    agent = uvicorn.Server(
        uvicorn.Config(
            build_agent_app(router), host=router.cfg.host, port=router.cfg.port, log_level="warning"
        )
    )
    admin = uvicorn.Server(
        uvicorn.Config(
            build_admin_app(router), host="127.0.0.1", port=router.cfg.admin_port, log_level="warning"
        )
    )
    tasks = [asyncio.ensure_future(agent.serve()), asyncio.ensure_future(admin.serve())]
    try:  # each server traps the interrupt for itself: when one stops, stop the other
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        agent.should_exit = admin.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await router.aclose()

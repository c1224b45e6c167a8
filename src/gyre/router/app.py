"""HTTP faces of the router: the agent-facing OpenAI API and, on another port, the admin API.

Agent-facing (``router.host:router.port``):
  ``/s/{token}/v1/...`` or ``/v1/...`` with ``Authorization: Bearer {token}``; the role comes from
  ``/s/{token}/{role}/v1/...`` or the ``X-Gyre-Role`` header (default ``main``).
  ``POST chat/completions``, ``POST completions``, ``GET models``, ``GET gyre/records`` (this session's only),
  and the Anthropic Messages API's ``POST messages`` (`gyre.router.anthropic`; its token may also come as
  ``x-api-key``; its errors in that API's shape), and the Responses API's ``POST responses`` and
  ``GET responses/{id}`` (`gyre.router.responses`).
Admin (127.0.0.1:``router.admin_port``): sessions (and each one's calls at the gate), engines (add, drain, resume,
remove), statistics.

Limits before decoding: a body over ``router.max_body_mib`` is refused from its declared length, else counted as it
arrives; one with more than ``router.max_json_values`` values is refused by a count of its structural bytes before
it is decoded; msgspec refuses nesting past Python's recursion limit as it decodes. A call takes its session's slot
(`CallGate`) before its body is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gyre.engine.http import sse_event
from gyre.errors import ConfigError, EngineRequestError, GyreError
from gyre.journal.records import Role
from gyre.router import anthropic, responses
from gyre.router.openai_types import (
    AddEngineRequest,
    ChatRequest,
    CompletionRequest,
    OpenSessionRequest,
    RouterError,
)
from gyre.router.pool import CallControl
from gyre.router.routing import ROLES, Router

if TYPE_CHECKING:
    from gyre.router.listener import ConnectionGate

INLINE_DECODE_BYTES = 256 << 10  # larger request bodies are counted and decoded off the event loop
MAX_HEADER_BYTES = 32 << 10  # a request's header lines together (a scaffold sends well under 4 KiB)
# the rest of a body over the limit is read and dropped, up to this much for this long, before its 413 (so that the
# client, still sending, is not reset before it reads the answer)
DISCARD_BYTES = 64 << 20
DISCARD_S = 2.0
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


class AgentApp:
    """The agent-facing OpenAI-compatible ASGI application.

    A plain ASGI callable rather than a framework app: this path carries every model call of every agent, and
    routing four paths by hand costs a fraction of a middleware stack (benchmarks/router.py).
    """

    OPS = frozenset({"chat/completions", "completions", "messages", "responses", "models", "gyre/records"})

    def __init__(self, router: Router) -> None:
        self.router = router
        self.limit = int(router.cfg.max_body_mib * 2**20)
        self.body_timeout_s = router.cfg.body_timeout_s

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        reply = _Reply(send, messages_api=scope["path"].endswith("/v1/messages"))
        try:
            await self._dispatch(scope, receive, reply)
        except Exception as exc:
            if isinstance(exc, RouterError):
                error = exc
            elif isinstance(exc, EngineRequestError):
                error = RouterError(str(exc), exc.status)
            else:
                log.exception("unexpected error in %s", scope.get("path"))
                error = RouterError(f"internal error: {exc!r}", 500, "server_error")
            if reply.started:  # mid-stream: the status is sent; the stream ends with an error event
                await reply.end_stream(error)
            else:  # a body left unread (too large, too slow) closes the connection
                await reply.json(error.status, reply.error_body(error), close=error.status in (408, 413, 431))

    async def _dispatch(self, scope: dict[str, Any], receive: Any, reply: _Reply) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        header_bytes = sum(len(name) + len(value) for name, value in scope["headers"])
        if header_bytes > MAX_HEADER_BYTES:
            raise RouterError(f"the request headers hold {header_bytes} bytes; the limit is {MAX_HEADER_BYTES}",
                              431)  # fmt: skip
        if path == "/health" and method == "GET":
            await reply.json(200, {"status": "ok", "engines": self.router.pool.statistics().engines})
            return
        token, role, op = self._parse(path, scope["headers"])
        retrieve = op.startswith("responses/")  # GET responses/{id}
        expected = "GET" if op in ("models", "gyre/records") or retrieve else "POST"
        if method != expected:
            raise RouterError(f"{method} is not allowed on {path}", 405)
        router = self.router
        router.session(token)  # 401 before reading the body
        if op == "models":
            model = {"id": router.model_name, "object": "model", "created": 0, "owned_by": "gyre"}
            await reply.json(200, {"object": "list", "data": [model]})
            return
        if op == "gyre/records":
            await reply.json(200, {"records": router.records(token)})
            return
        if retrieve:
            await reply.json(200, responses.retrieve(router, token, op.removeprefix("responses/")))
            return
        declared = _content_length(scope["headers"])
        if declared is not None and declared > self.limit:  # refused unread: the body never costs memory
            await self._refuse_large(receive)
        # the call's slot is taken before its body is read: a call waiting behind its session's own limit holds
        # no more of its body than the connection's read buffer (uvicorn pauses reading past 64 KiB)
        async with router.admit(token):
            raw = await self._read_body(receive)
            control = CallControl()
            async with _abort_on_disconnect(receive, control):
                if op == "completions":
                    creq = await self._decode(raw, CompletionRequest)
                    del raw  # a large body is not kept for the length of the call
                    if creq.stream:
                        raise RouterError(
                            "streaming completions are not supported; use chat/completions",
                            422,
                            param="stream",
                        )
                    await reply.json(200, await router.complete(token, creq, role, control))
                    return
                if op == "messages":
                    mreq = await self._decode(raw, anthropic.MessagesRequest)
                    del raw
                    if not mreq.stream:
                        await reply.json(200, await anthropic.create(router, token, mreq, role, control))
                        return
                    await self._stream_events(reply, anthropic.stream(router, token, mreq, role, control))
                    return
                if op == "responses":
                    rreq = await self._decode(raw, responses.ResponsesRequest)
                    del raw
                    if not rreq.stream:
                        await reply.json(200, await responses.create(router, token, rreq, role, control))
                        return
                    await self._stream_events(reply, responses.stream(router, token, rreq, role, control))
                    return
                req = await self._decode(raw, ChatRequest)
                del raw
                if not req.stream:
                    await reply.json(200, await router.chat(token, req, role, control))
                    return
                await self._stream(reply, router.chat_stream(token, req, role, control))

    async def _decode(self, raw: bytearray, type_: type[T]) -> T:
        """The request ``raw`` holds, its JSON values counted first (`count_values`: too many is refused before
        any is decoded): here when small, else on the router's decode thread (`check_tools`, on the loop later,
        refuses a wide schema before walking its members)."""
        limit = self.router.max_json_values
        if len(raw) <= INLINE_DECODE_BYTES:
            return _decode(raw, type_, limit)
        return await self.router.off_loop(_decode, raw, type_, limit)

    @staticmethod
    async def _stream(reply: _Reply, chunks: AsyncIterator[dict[str, Any]]) -> None:
        """Stream a chat call's chunks as server-sent events; to its end, even when the client has gone."""
        async with contextlib.aclosing(chunks):  # type: ignore[type-var]  # an async generator
            first = await anext(chunks)  # errors surface as a status code before the stream starts
            await reply.start_stream()
            await reply.event(msgspec.json.encode(first))
            async for chunk in chunks:
                await reply.event(msgspec.json.encode(chunk))
        await reply.event(b"[DONE]", last=True)

    @staticmethod
    async def _stream_events(reply: _Reply, events: AsyncIterator[anthropic.Event]) -> None:
        """Stream named events (the Messages API's); to their end, even when the client has gone."""
        async with contextlib.aclosing(events):  # type: ignore[type-var]  # an async generator
            name, data = await anext(events)  # errors surface as a status code before the stream starts
            await reply.start_stream()
            await reply.event(msgspec.json.encode(data), name=name)
            async for name, data in events:
                await reply.event(msgspec.json.encode(data), name=name)
        await reply.close_stream()

    def _parse(self, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[str, Role, str]:
        """``/s/{token}[/{role}]/v1/{op}`` or ``/v1/{op}`` with a bearer token -> (token, role, op)."""
        parts = path.split("/", 5)  # ['', 's', token, 'v1' | role, ...]
        token = role = None
        if len(parts) >= 4 and parts[1] == "s":
            token = parts[2]
            if parts[3] == "v1":
                op = "/".join(parts[4:])
            elif len(parts) >= 5 and parts[4] == "v1":
                role, op = parts[3], "/".join(parts[5:])
            else:
                op = ""
        elif len(parts) >= 3 and parts[1] == "v1":
            op = "/".join(parts[2:])
        else:
            op = ""
        if op not in self.OPS and not (op.startswith("responses/") and len(op) > len("responses/")):
            raise RouterError(f"no such path: {path}", 404, "not_found_error")
        for name, value in headers:
            if name == b"authorization" and token is None:
                scheme, _, credential = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer" and credential.strip():
                    token = credential.strip()
            elif name == b"x-api-key" and token is None and value.strip():  # the Anthropic clients' header
                token = value.decode("latin-1").strip()
            elif name == b"x-gyre-role" and role is None:
                role = value.decode("latin-1")
        if token is None:
            raise RouterError("missing session: use /s/{token}/v1 or Authorization: Bearer {token}", 401,
                              "authentication_error")  # fmt: skip
        role = role or "main"
        if role not in ROLES:
            raise RouterError(f"unknown role {role!r}; roles: {sorted(ROLES)}", 400, param="role")
        return token, role, op  # type: ignore[return-value]

    async def _read_body(self, receive: Any) -> bytearray:
        """The body, counted as it arrives (one copy of it at most: no list of chunks to join)."""
        body = bytearray()
        try:
            async with asyncio.timeout(self.body_timeout_s):  # a half-sent body must not hold its connection
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise RouterError("the client disconnected before sending the whole body", 400)
                    chunk = message.get("body", b"")
                    if len(body) + len(chunk) > self.limit:
                        del body
                        await self._refuse_large(receive, message.get("more_body", False))
                    body += chunk
                    if not message.get("more_body"):
                        return body
        except TimeoutError:
            raise RouterError(
                f"the request body did not arrive within {self.body_timeout_s:g} s (router.body_timeout_s)",
                408,
            ) from None

    async def _refuse_large(self, receive: Any, more: bool = True) -> NoReturn:
        """A 413 for a body over the limit, once what follows of it (up to `DISCARD_BYTES`, for `DISCARD_S` at most)
        has been read and dropped: a connection closed with unread bytes is reset, and the client would lose the
        answer. Nothing of the body is kept."""
        left = DISCARD_BYTES
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DISCARD_S):
                while more and left > 0:
                    message = await receive()
                    left -= len(message.get("body", b""))
                    more = message["type"] == "http.request" and message.get("more_body", False)
        raise RouterError(f"the request body is larger than the limit of {self.limit} bytes", 413)


class _Reply:
    """The response side of one agent request: knows whether the response has started."""

    def __init__(self, send: Any, messages_api: bool = False) -> None:
        self._send = send
        self.started = False
        self.messages_api = messages_api  # answering Anthropic's Messages API: its errors, its stream's end

    def error_body(self, error: RouterError) -> dict[str, Any]:
        """``error`` as this request's API writes errors."""
        return anthropic.error_body(error) if self.messages_api else error.body()

    async def json(self, status: int, data: Any, close: bool = False) -> None:
        """A whole JSON response."""
        body = msgspec.json.encode(data)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if close:
            headers.append((b"connection", b"close"))
        self.started = True
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body})

    async def start_stream(self) -> None:
        """Status 200 and the headers of a server-sent event stream."""
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        self.started = True
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})

    async def event(self, payload: bytes, last: bool = False, name: str | None = None) -> None:
        """One event, named or not (a client that went away is not an error: the server drops what is sent to it)."""
        data = sse_event(payload) if name is None else b"event: " + name.encode() + b"\n" + sse_event(payload)
        await self._send({"type": "http.response.body", "body": data, "more_body": not last})

    async def close_stream(self) -> None:
        """End a stream whose last event is sent."""
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def end_stream(self, error: RouterError) -> None:
        """End a started stream with an error event, then ``[DONE]`` (the Messages API: its ``error`` event)."""
        with contextlib.suppress(Exception):
            if self.messages_api:
                await self.event(msgspec.json.encode(anthropic.error_body(error)), name="error")
                await self.close_stream()
                return
            await self.event(msgspec.json.encode(error.body()))
            await self.event(b"[DONE]", last=True)


@contextlib.asynccontextmanager
async def _abort_on_disconnect(receive: Any, control: CallControl) -> AsyncIterator[None]:
    """While the block runs, a client that disconnects aborts the call (it then ends with what it generated)."""

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        await control.abort()

    watcher = asyncio.ensure_future(watch())  # owned by this block: cancelled when it ends
    try:
        yield
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


_STRUCTURE = (b",", b":", b"[", b"{")  # each begins one JSON value (a key, for ':'), but the first
SCAN_WINDOW_BYTES = 256 << 10  # a body is scanned for its strings this much at a time (memory: a few windows)


def count_values(raw: bytes | bytearray, limit: int) -> int:
    """About the JSON values (keys included) in ``raw``, without decoding it; 400 naming ``limit`` past it.

    Decoded, a value costs 30-200 bytes where its JSON may take 3 (``{},``): 8 MiB of empty objects became 150 MB
    of dicts before any check could look at them. Counting the structural bytes is a few passes at C speed. Only
    when that count is over the limit are the strings, whose commas and brackets are text, cut out and the rest
    counted again, a window at a time, so that the scan itself costs a few windows, not a copy of the body.
    """
    count = 1 + sum(raw.count(c) for c in _STRUCTURE)
    if count <= limit:
        return count
    count, inside, at = 1, 0, 0  # inside: 1 while the window starts within a string
    while at < len(raw) and count <= limit:  # stops once past the limit
        end = min(at + SCAN_WINDOW_BYTES, len(raw))
        while end < len(raw) and raw[end - 1] == 0x5C:  # never between a backslash and what it escapes
            end += 1
        window = bytes(raw[at:end]).replace(b"\\\\", b"").replace(b'\\"', b"")
        pieces = window.split(b'"')  # outside and inside strings in turn
        outside = b"".join(pieces[inside::2])
        count += sum(outside.count(c) for c in _STRUCTURE)
        inside ^= (len(pieces) - 1) & 1
        del window, pieces, outside
        at = end
    if count > limit:
        raise RouterError(
            f"the request holds about {count} JSON values; at most {limit} are accepted (router.max_json_values)",
            400,
        )
    return count


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The ``content-length`` a request declares (None: none, or not a number; the server checks it)."""
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.strip().isdigit() else None
    return None


def _decode(raw: bytes | bytearray, type_: type[T], max_values: int = 0) -> T:
    """``raw`` as ``type_``: its values counted first when ``max_values`` is given; every failure a 400."""
    if max_values:
        count_values(raw, max_values)
    try:
        return msgspec.json.decode(raw, type=type_)
    except msgspec.ValidationError as exc:
        raise RouterError(f"invalid request: {exc}", 400) from None
    except msgspec.DecodeError as exc:
        raise RouterError(f"the body is not valid JSON: {exc}", 400) from None
    except RecursionError:
        raise RouterError("the body is nested too deeply", 400) from None


def build_agent_app(router: Router) -> AgentApp:
    """The agent-facing OpenAI-compatible application."""
    return AgentApp(router)


def build_admin_app(router: Router) -> Starlette:
    """Sessions, engines and statistics: for the driver and operators, never for agents."""

    timeout_s, limit = router.cfg.body_timeout_s, 2**20  # admin bodies are small

    async def body(request: Request, type_: type[T]) -> T:
        size, parts = 0, []
        try:
            async with asyncio.timeout(timeout_s):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise RouterError(f"the request body is larger than the limit of {limit} bytes", 413)
                    parts.append(chunk)
        except TimeoutError:
            raise RouterError(f"the request body did not arrive within {timeout_s:g} s", 408) from None
        raw = b"".join(parts)
        return _decode(raw if raw.strip() else b"{}", type_)

    async def open_session(request: Request) -> Response:
        data = await body(request, OpenSessionRequest)
        token = router.open_session(data.execution_id)
        host, port = router.cfg.host, router.cfg.port
        return _json({"token": token, "base_url": f"http://{host}:{port}/s/{token}/v1"})

    async def close_session(request: Request) -> Response:
        if router.sessions.close(request.path_params["token"]) is None:
            raise RouterError("unknown session token", 404, "not_found_error")
        return _json({"closed": True})

    async def session_calls(request: Request) -> Response:
        session = router.sessions.get(request.path_params["token"])
        if session is None:
            raise RouterError("unknown session token", 404, "not_found_error")
        return _json(router.gate.statistics(session))

    async def session_records(request: Request) -> Response:
        session = router.sessions.get(request.path_params["token"])
        if session is None:
            raise RouterError("unknown session token", 404, "not_found_error")
        return _json({"records": session.records})

    async def engines(request: Request) -> Response:
        return _json(router.pool.statistics())

    async def add_engine(request: Request) -> Response:
        data = await body(request, AddEngineRequest)
        engine = router.pool.add(data.url, data.name)
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
        Route("/admin/sessions/{token}/calls", _guard(session_calls), methods=["GET"]),
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


def head_timeout_protocol(timeout_s: float, gate: ConnectionGate | None = None) -> Any:
    """uvicorn's HTTP protocol, closing a connection whose request head does not arrive within ``timeout_s``, and
    admitting connections through ``gate`` (which closes the longest-waiting one at a cap).

    uvicorn times only the idle gap between requests: a client that opens a connection and sends half a request
    line or header (or nothing) would hold it forever. "auto" (uvicorn's own choice) where httptools is missing.
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "auto"

    class HeadTimeoutProtocol(HttpToolsProtocol):
        _head_timer: asyncio.TimerHandle | None = None
        _receiving = False  # a request has begun and has not arrived whole

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(timeout_s, self.transport.close)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if gate is not None and not gate.admit(self, self.client[0] if self.client else ""):
                transport.close()  # every connection in the way is serving a request
                return
            self._arm()  # until the first head is complete

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._receiving = True
            self._arm()  # a request started on a kept-alive connection: its head must arrive in time too

        def on_headers_complete(self) -> None:
            self._disarm()  # the body has its own timeout (router.body_timeout_s, in the application)
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._receiving = False
            if gate is not None:
                gate.busy(self)  # the request is whole: served, not closed to make room
                if self.cycle is not None and self.cycle.response_complete:  # answered before it was whole
                    gate.waiting(self)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            idle = self.cycle is None or self.cycle.response_complete  # no pipelined request started just now
            if gate is not None and idle and not self._receiving:
                gate.waiting(self)

        def evict(self) -> None:
            """Closed to make room (`ConnectionGate`): a request half arrived is told why, an idle connection just
            closed (its client finds it closed and opens another)."""
            answered = self.cycle is not None and self.cycle.response_started  # (before the body came whole)
            if self._receiving and not answered and not self.transport.is_closing():
                self.transport.write(EVICTED_RESPONSE)
            self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if gate is not None:
                gate.release(self)
            super().connection_lost(exc)

    return HeadTimeoutProtocol


_EVICTED = msgspec.json.encode(
    RouterError(
        "the request did not arrive whole before the router needed its connection for another (it holds "
        "router.max_connections at most); send it again",
        408,
    ).body()
)
EVICTED_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_EVICTED), _EVICTED)
)

# Idle agent connections stay open this long: far longer than clients keep theirs (httpx: 5 s), so a client never
# reuses a connection the server has just closed (the agent would see a connection error after a long tool call).
KEEP_ALIVE_S = 300


async def serve_router(router: Router) -> None:
    """Serve both applications until cancelled (agent-facing and admin, one event loop)."""
    try:
        await _serve(router)
    finally:
        await router.aclose()


async def _serve(router: Router) -> None:
    import uvicorn

    from gyre.router.listener import AgentServer, ConnectionGate, bind

    gate = ConnectionGate.for_process(router.cfg.max_connections, router.cfg.max_connections_per_client)
    agent_config = uvicorn.Config(
        build_agent_app(router),
        host=router.cfg.host,
        port=router.cfg.port,
        log_level="warning",
        timeout_keep_alive=KEEP_ALIVE_S,
        http=head_timeout_protocol(router.cfg.body_timeout_s, gate),
    )
    try:
        sock = bind(router.cfg.host, router.cfg.port, agent_config.backlog)
    except OSError as exc:
        raise ConfigError(
            f"the router cannot listen on {router.cfg.host}:{router.cfg.port} (router.host, router.port): {exc}"
        ) from None
    agent = AgentServer(agent_config, sock, gate)  # accepts every waiting connection at once (see its module)
    admin = uvicorn.Server(
        uvicorn.Config(
            build_admin_app(router),
            host="127.0.0.1",
            port=router.cfg.admin_port,
            log_level="warning",
            http=head_timeout_protocol(router.cfg.body_timeout_s),
        )
    )
    tasks = [asyncio.ensure_future(agent.serve()), asyncio.ensure_future(admin.serve())]
    # each server traps the interrupt for itself: when one stops, stop the other
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    agent.should_exit = admin.should_exit = True
    await asyncio.gather(*tasks, return_exceptions=True)

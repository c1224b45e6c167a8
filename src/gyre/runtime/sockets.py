"""Each command-agent execution's own door to the router: a Unix socket that serves that execution's session only.

The socket lives in a directory the driver creates and owns (``gyre-router-*`` in the system temp dir, mode 0755,
the socket 0666 for sandboxes that run as their own uid), bound read-only into that execution's sandbox alone, at
``/run/gyre``: no sandbox can rename, replace or even see another execution's socket. Every request on it must name
that execution's session token: any other, even a live token learnt elsewhere, is refused with 401, so a token is
worth nothing outside its own sandbox. The socket, its connections and its directory go when the execution ends.
A python agent (run in the driver's process) gets a loopback TCP port instead (`session_port`), restricted the
same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import os
import resource
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec

from gyre.router.routing import Router
from gyre.sandbox import filetree

SOCKET_NAME = "router.sock"
# connections one execution's socket holds at once (an agent makes a few; each costs the driver a descriptor), and
# all sockets together, a share of the driver's descriptor limit so that it never runs out for its own work
MAX_CONNECTIONS = 64
DRIVER_SHARE = 0.5
_REFUSED = {"message": "this socket serves another session", "type": "authentication_error", "code": 401}
CLOSE_S = 5.0  # how long closing a socket waits for its connections' tasks once they are cancelled


class _Budget:
    """The connections every session socket of this process holds (the driver's descriptors they may use)."""

    def __init__(self) -> None:
        self.open = 0
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.limit = (
            max(int(soft * DRIVER_SHARE), MAX_CONNECTIONS) if soft != resource.RLIM_INFINITY else 1 << 20
        )


_BUDGET = _Budget()


class _Refused(asyncio.Protocol):
    """A connection past a cap: closed as soon as it is accepted (its descriptor is the driver's at once again)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _OwnSession:
    """The agent API restricted to one session: a request that names another token is refused before it runs."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self.token = app, token.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            named = _token(scope)
            if named is not None and not hmac.compare_digest(named, self.token):
                body = msgspec.json.encode({"error": _REFUSED})
                headers = [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def _token(scope: dict[str, Any]) -> bytes | None:
    """The session token a request names (``/s/{token}/...`` first, then a bearer token), as the router reads it."""
    parts = scope["path"].split("/", 3)
    if len(parts) >= 4 and parts[1] == "s":
        return bytes(parts[2], "utf-8", "surrogateescape")
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, credential = value.partition(b" ")
            if scheme.lower() == b"bearer" and credential.strip():
                return credential.strip()
    return None


class _Counted(asyncio.Protocol):
    """uvicorn's protocol, counted in `_BUDGET` while its connection is open (every callback forwarded)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _BUDGET.open += 1
        self.counted = True
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.counted:
            _BUDGET.open -= 1
            self.counted = False
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        result: bool | None = self.inner.eof_received()
        return result

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


@contextlib.asynccontextmanager
async def session_socket(router: Router, token: str) -> AsyncIterator[str]:
    """A new directory holding `SOCKET_NAME`, serving ``router``'s agent API for ``token`` only, while in use."""
    directory = await asyncio.to_thread(tempfile.mkdtemp, prefix="gyre-router-")
    try:
        # the sandbox's own uid (uid containment) traverses it; only the driver writes in it
        os.chmod(directory, 0o755)
        path = os.path.join(directory, SOCKET_NAME)
        loop = asyncio.get_running_loop()
        async with _serving(router, token, lambda protocol: loop.create_unix_server(protocol, path=path)):
            # connecting needs write permission on the socket, whatever uid the sandbox runs as
            os.chmod(path, 0o666)
            yield directory
    finally:
        await asyncio.shield(asyncio.to_thread(filetree.remove, directory))


@contextlib.asynccontextmanager
async def session_port(router: Router, token: str) -> AsyncIterator[int]:
    """A new loopback TCP port serving ``router``'s agent API for ``token`` only, while in use: the door of an
    in-process (python) agent, whose HTTP clients need a URL. Other local processes reach it too, but a request
    naming any other token is refused, so it is worth no more than the token itself."""
    loop = asyncio.get_running_loop()
    listen = functools.partial(loop.create_server, host="127.0.0.1", port=0)
    async with _serving(router, token, listen) as server:
        yield server.sockets[0].getsockname()[1]


@contextlib.asynccontextmanager
async def _serving(
    router: Router, token: str, listen: Callable[[Callable[[], asyncio.Protocol]], Awaitable[asyncio.Server]]
) -> AsyncIterator[asyncio.Server]:
    """``router``'s agent API for ``token`` only on the server ``listen(protocol)`` starts, while in use; then its
    connections are shut and their calls abandoned."""
    import uvicorn
    from uvicorn.server import ServerState

    from gyre.router.app import KEEP_ALIVE_S, build_agent_app, head_timeout_protocol

    config = uvicorn.Config(
        _OwnSession(build_agent_app(router), token),
        log_config=None,
        log_level="warning",
        lifespan="off",
        proxy_headers=False,
        timeout_keep_alive=KEEP_ALIVE_S,
        http=head_timeout_protocol(router.cfg.body_timeout_s),  # half a request must not hold it forever
    )
    config.load()
    state = ServerState()

    def protocol() -> asyncio.Protocol:
        if len(state.connections) >= MAX_CONNECTIONS or _BUDGET.open >= _BUDGET.limit:
            return _Refused()
        inner = config.http_protocol_class(config=config, server_state=state, app_state={})  # type: ignore[call-arg]
        return _Counted(inner)

    server = await listen(protocol)
    try:
        yield server
    finally:
        server.close()
        for connection in list(state.connections):
            connection.shutdown()
        for task in list(state.tasks):  # calls of an execution that is over: abandoned
            task.cancel()
        if state.tasks:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_S):
                    await asyncio.wait(list(state.tasks))

"""The agent port's listening socket: every pending connection is accepted each time the socket is readable.

libuv, under uvloop, accepts one connection per event-loop iteration (since libuv 1.45, "unix: don't accept()
connections in a loop"). A loaded router spends tens of milliseconds on one iteration (it serves every request that
became ready), so a burst of new agent connections queued in the kernel, one iteration each: at 256 concurrent
connections the last ones got their first answer only after the others had finished theirs (issue 17,
``benchmarks/router.py``). The stdlib loop accepts up to the backlog per iteration; this does the same on uvloop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

import uvicorn

from gyre.engine.http import LOCAL_ERRNOS

log = logging.getLogger(__name__)
ACCEPT_BURST = (
    1024  # connections taken per readiness at most, so a connection storm cannot stall one iteration
)
ACCEPT_RETRY_S = (
    1.0  # out of descriptors: stop accepting this long (connections wait in the kernel's backlog)
)


def bind(host: str, port: int, backlog: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (the first address ``host`` resolves to)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class Listener:
    """Accepts on ``sock`` and hands each connection to the loop with a new ``protocol()``; owns ``sock``."""

    def __init__(self, sock: socket.socket, protocol: Callable[[], asyncio.Protocol]) -> None:
        self._sock, self._protocol = sock, protocol
        self._loop = asyncio.get_running_loop()
        # hand-overs in flight: each runs for one loop iteration (until the protocol's connection_made)
        self._handing: set[asyncio.Task[Any]] = set()
        self._serving = True
        self._loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(ACCEPT_BURST):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in LOCAL_ERRNOS:  # the connections left wait in the backlog until some are freed
                    log.warning("cannot accept agent connections for %g s: %s", ACCEPT_RETRY_S, exc)
                    self._loop.remove_reader(self._sock.fileno())
                    self._loop.call_later(ACCEPT_RETRY_S, self._resume)
                return  # anything else (a connection reset before it was accepted): the next readiness goes on
            conn.setblocking(False)
            task = self._loop.create_task(self._hand_over(conn))
            self._handing.add(task)
            task.add_done_callback(self._handing.discard)

    async def _hand_over(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._protocol, conn)
        except Exception as exc:  # the client went away before its transport was set up, say
            conn.close()
            log.warning("an accepted agent connection could not be set up: %r", exc)

    def _resume(self) -> None:
        if self._serving:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    # the part of asyncio.Server that uvicorn uses
    def close(self) -> None:
        """Stop accepting and close the socket; connections already accepted carry on."""
        if self._serving:
            self._serving = False
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()

    async def wait_closed(self) -> None:
        """Return once the connections accepted before `close` have been handed over."""
        if self._handing:
            await asyncio.wait(list(self._handing))

    def is_serving(self) -> bool:
        """Whether connections are still accepted."""
        return self._serving


class AgentServer(uvicorn.Server):
    """uvicorn's server (its clock, signals and graceful shutdown) accepting through a `Listener` on ``sock``."""

    def __init__(self, config: uvicorn.Config, sock: socket.socket) -> None:
        super().__init__(config)
        self.sock = sock

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start-up with the `Listener` in place of ``loop.create_server``."""
        await self.lifespan.startup()
        config = self.config

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        self.servers = [Listener(self.sock, protocol)]  # type: ignore[list-item]
        self.started = True

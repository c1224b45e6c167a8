"""The agent port's listening socket: every pending connection is accepted each time the socket is readable, and
no more connections are held than the router's descriptors allow.

libuv, under uvloop, accepts one connection per event-loop iteration (since libuv 1.45, "unix: don't accept()
connections in a loop"). A loaded router spends tens of milliseconds on one iteration (it serves every request that
became ready), so a burst of new agent connections queued in the kernel, one iteration each: at 256 concurrent
connections the last ones got their first answer only after the others had finished theirs (issue 17,
``benchmarks/router.py``). The stdlib loop accepts up to the backlog per iteration; this does the same on uvloop.

`ConnectionGate` caps the connections held at once, in all and from one client address (issue 31: slow
connections past the router's descriptor limit stalled a polite session for 22 s). A connection is *waiting* while
it has no whole request in hand (a request head or body still arriving, or idle between requests); at a cap, a
waiting one is closed to make room (those that never sent a whole request first, longest waiting first), so a flood
of silent or trickling connections cannot keep a client that sends whole requests out, nor close its kept-alive
connections. Only when every connection in the way is serving a request is the new one refused.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import resource
import socket
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from gyre.engine.http import LOCAL_ERRNOS

log = logging.getLogger(__name__)
ACCEPT_BURST = (
    1024  # connections taken per readiness at most, so a connection storm cannot stall one iteration
)
# at the connection cap, where every connection accepted closes a waiting one: so few per readiness that one accepted
# a moment ago has its request read before it is the longest waiting (a flood admitted 1,024 at a time closed new
# connections of polite clients before their requests were read)
ACCEPT_BURST_AT_CAP = 64
ACCEPT_RETRY_S = (
    1.0  # out of descriptors: stop accepting this long (connections wait in the kernel's backlog)
)
DESCRIPTOR_SHARE = 0.5  # of the process's descriptor limit, for agent connections when no cap is configured
CLIENT_SHARE = 0.25  # of that cap, for one address other than loopback when no cap is configured
REPORT_EVERY_S = 10.0  # closed and refused connections are logged at most this often


class ConnectionGate:
    """Admits connections under a total cap and a per-address cap, closing a waiting one to make room.

    The one closed is the longest-waiting connection that has never sent a whole request (a silent or trickling
    one), else the longest-idle of those that have (a client's kept-alive connection, which it will find closed and
    replace). Connections are objects with an ``evict()`` that closes them; the protocol tells the gate when one
    starts or stops waiting (`waiting`, `busy`) and when it is gone (`release`). Loopback addresses have no cap of
    their own: every agent on the router's host shares them, so only the total applies.
    """

    def __init__(self, limit: int, per_client: int) -> None:
        self.limit, self.per_client = limit, per_client
        self.client: dict[Any, str] = {}  # open connection -> its address
        self.count: dict[str, int] = {}  # address -> open connections
        self.served: set[Any] = set()  # connections that have sent a whole request
        # waiting connections, never served then served, longest waiting first: in all, and by address
        self.idle: tuple[dict[Any, None], dict[Any, None]] = ({}, {})
        self.idle_of: dict[str, tuple[dict[Any, None], dict[Any, None]]] = {}
        self.evicted = self.refused = 0
        self._reported = (0, 0)
        self._report_at = 0.0

    @classmethod
    def for_process(cls, limit: int, per_client: int) -> ConnectionGate:
        """Caps from configuration; 0 takes `DESCRIPTOR_SHARE` of this process's descriptor limit (and
        `CLIENT_SHARE` of that per address)."""
        if limit == 0:
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            limit = 1 << 20 if soft == resource.RLIM_INFINITY else max(64, int(soft * DESCRIPTOR_SHARE))
        return cls(limit, per_client or max(16, int(limit * CLIENT_SHARE)))

    def admit(self, conn: Any, address: str) -> bool:
        """Whether ``conn``, just made from ``address``, may stay (closing a waiting one if that makes room)."""
        own = not _loopback(address) and self.count.get(address, 0) >= self.per_client
        if own or len(self.client) >= self.limit:
            pools = self.idle_of.get(address, ({}, {})) if own else self.idle
            victim = next(iter(pools[0]), None) or next(iter(pools[1]), None)
            if victim is None:
                self.refused += 1
                self._report()
                return False
            self.release(victim)
            victim.evict()
            self.evicted += 1
            self._report()
        self.client[conn] = address
        self.count[address] = self.count.get(address, 0) + 1
        self.waiting(conn)
        return True

    def waiting(self, conn: Any) -> None:
        """``conn`` has no whole request in hand from now (made, or its last response sent)."""
        address = self.client.get(conn)
        if address is None:
            return
        kind = conn in self.served
        if conn not in self.idle[kind]:
            self.idle[kind][conn] = None
            self.idle_of.setdefault(address, ({}, {}))[kind][conn] = None

    def busy(self, conn: Any) -> None:
        """``conn``'s request has arrived whole: it is not closed to make room until its response is sent."""
        if conn in self.client:
            self._unwait(conn)
            self.served.add(conn)

    def release(self, conn: Any) -> None:
        """``conn`` is gone."""
        if conn not in self.client:
            return
        self._unwait(conn)
        self.served.discard(conn)
        address = self.client.pop(conn)
        self.count[address] -= 1
        if not self.count[address]:
            del self.count[address]

    def _unwait(self, conn: Any) -> None:
        kind = conn in self.served
        if conn in self.idle[kind]:
            del self.idle[kind][conn]
            address = self.client[conn]
            of = self.idle_of[address]
            del of[kind][conn]
            if not of[0] and not of[1]:
                del self.idle_of[address]

    def _report(self) -> None:
        now = time.monotonic()
        if now >= self._report_at:
            self._report_at = now + REPORT_EVERY_S
            evicted, refused = self.evicted - self._reported[0], self.refused - self._reported[1]
            self._reported = (self.evicted, self.refused)
            log.warning(
                "agent connections at their cap (%d in all, %d from one address): %d waiting ones closed and %d "
                "refused since the last report (router.max_connections, router.max_connections_per_client)",
                self.limit, self.per_client, evicted, refused,
            )  # fmt: skip


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a Unix socket's peer (no address)
        return True


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

    def __init__(
        self,
        sock: socket.socket,
        protocol: Callable[[], asyncio.Protocol],
        gate: ConnectionGate | None = None,
    ) -> None:
        self._sock, self._protocol, self._gate = sock, protocol, gate
        self._loop = asyncio.get_running_loop()
        # hand-overs in flight: each runs for one loop iteration (until the protocol's connection_made)
        self._handing: set[asyncio.Task[Any]] = set()
        self._serving = True
        self._loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        gate = self._gate
        at_cap = gate is not None and len(gate.client) >= gate.limit
        for _ in range(ACCEPT_BURST_AT_CAP if at_cap else ACCEPT_BURST):
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

    def __init__(
        self, config: uvicorn.Config, sock: socket.socket, gate: ConnectionGate | None = None
    ) -> None:
        super().__init__(config)
        self.sock, self.gate = sock, gate

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start-up with the `Listener` in place of ``loop.create_server``."""
        await self.lifespan.startup()
        config = self.config

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        self.servers = [Listener(self.sock, protocol, self.gate)]  # type: ignore[list-item]
        self.started = True

"""A lean HTTP/1.1 keep-alive client for the engine API's request/response calls.

httpx's connection pool re-checks every pooled connection (a syscall each) on every request, which made the router
quadratic in its concurrency (benchmarks/router.py: 1,100 requests/s at 1 concurrent, 370 at 256). This pool hands
out idle connections in O(1) and parses responses with plain stream reads. Streaming responses still use httpx.
A request that has to wait for a connection is served before any that arrives after it (issue 17: under a burst,
requests that found an idle connection overtook those waiting for a connect, for several rounds).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gyre.errors import EngineUnavailable


@dataclass
class HttpResponse:
    """Status, headers (lower-case names) and body of one response."""

    status_code: int
    headers: dict[str, str]
    content: bytes

    @property
    def text(self) -> str:
        """The body as text."""
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.content)


# A connection the router's own process cannot open (out of descriptors, buffers or local ports) says nothing about
# the engine: under a burst of thousands of calls these errors marked a healthy engine gone (issue 14).
LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EADDRNOTAVAIL})


class LocalResourceError(EngineUnavailable):
    """This process could not open a connection to the engine for want of its own resources; retry later."""


def local_cause(exc: BaseException) -> OSError | None:
    """The local-resource OSError behind ``exc`` (itself or a cause), if any."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, OSError) and seen.errno in LOCAL_ERRNOS:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


# UTF-8 of the characters Python's str.splitlines (and so many SSE readers) takes as line ends besides CR and LF.
# msgspec writes them raw inside JSON strings; escaped, every event stays one line for any reader.
_UNICODE_LINE_ENDS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))


def sse_event(payload: bytes) -> bytes:
    """One server-sent event carrying the JSON ``payload``: its Unicode line ends escaped, so it is one line."""
    if b"\xc2\x85" in payload or b"\xe2\x80" in payload:
        for raw, escaped in _UNICODE_LINE_ENDS:
            payload = payload.replace(raw, escaped)
    return b"data: " + payload + b"\n\n"


def sse_lines(buffer: bytearray, data: bytes) -> list[bytes]:
    """Append ``data`` to ``buffer`` and take the complete lines out of it, split on LF only (CR stripped).

    Splitting bytes, not text, keeps a U+0085 or U+2028 inside an event's JSON from ending its line."""
    buffer += data
    end = buffer.rfind(b"\n")
    if end < 0:
        return []
    lines = [line.rstrip(b"\r") for line in bytes(buffer[:end]).split(b"\n")]
    del buffer[: end + 1]
    return lines


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.close()


# Connections one pool opens at a time, so a burst of calls does not overflow the engine's accept backlog.
CONNECTS_AT_ONCE = 64


class HttpPool:
    """Keep-alive connections to one ``http://host:port``; any number of concurrent requests, first come first
    served when connections run short."""

    def __init__(
        self,
        base_url: str,
        timeout_s: float,
        connect_timeout_s: float,
        max_idle: int = 512,
        max_open: int = 4096,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"HttpPool speaks plain http://host:port, not {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.timeout_s, self.connect_timeout_s, self.max_idle = timeout_s, connect_timeout_s, max_idle
        self._idle: deque[_Connection] = deque()
        # requests in flight, so connections (file descriptors) stay bounded
        self._open = asyncio.Semaphore(max_open)
        # Requests that found no idle connection, oldest first. Each gets the next connection that is free, one
        # released by a request or one just opened, whichever comes first: a request that arrives later never
        # overtakes one that waits. Value: (connection, reused), or the error of a connect that failed.
        self._waiters: deque[asyncio.Future[tuple[_Connection, bool]]] = deque()
        # Connects in flight, owned by the pool (`close` cancels them): each hands its connection to the line.
        self._connects: set[asyncio.Task[_Connection]] = set()
        self._host_header = f"{self.host}:{self.port}".encode()

    async def request(
        self, method: str, path: str, body: bytes | None = None, json_body: bool = True
    ) -> HttpResponse:
        """Send one request and read its whole response; connection failures raise EngineUnavailable."""
        head = b"%s %s HTTP/1.1\r\nhost: %s\r\n" % (
            method.encode(),
            (self.prefix + path).encode(),
            self._host_header,
        )
        if body is not None:
            kind = b"application/json" if json_body else b"application/octet-stream"
            head += b"content-type: %s\r\ncontent-length: %d\r\n" % (kind, len(body))
        data = head + b"\r\n" + (body or b"")
        try:
            async with self._open, asyncio.timeout(self.timeout_s):
                while True:
                    conn, reused = await self._acquire()
                    try:
                        conn.writer.write(data)
                        response = await self._read(conn)
                    except (ConnectionError, asyncio.IncompleteReadError) as exc:
                        conn.close()
                        if reused and not getattr(exc, "partial", b""):
                            continue  # the server had closed this idle connection: it never saw the request
                        raise EngineUnavailable(
                            f"{self.host}:{self.port}{path}: connection lost: {exc!r}"
                        ) from exc
                    except BaseException:
                        conn.close()  # cancelled or timed out mid-request: the connection's state is unknown
                        raise
                    if response.headers.get("connection", "").lower() == "close":
                        conn.close()
                    else:
                        self._release(conn)
                    return response
        except TimeoutError as exc:
            raise EngineUnavailable(
                f"{self.host}:{self.port}{path} timed out after {self.timeout_s:.0f} s"
            ) from exc

    async def _acquire(self) -> tuple[_Connection, bool]:
        """A free connection and whether it served earlier requests; first come, first served."""
        if not self._waiters:
            while self._idle:
                conn = self._idle.pop()
                if not conn.reader.at_eof() and not conn.writer.is_closing():
                    return conn, True
                conn.close()
        waiter: asyncio.Future[tuple[_Connection, bool]] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._open_for_waiters()
        try:
            return await waiter
        except BaseException:  # cancelled (a timeout) or the connect failed: leave the line
            if not waiter.done() or waiter.cancelled():
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            elif waiter.exception() is None:  # a connection was handed over as this request gave up
                self._release(waiter.result()[0])
            raise

    def _open_for_waiters(self) -> None:
        """Start connects until one is on its way for every waiter, CONNECTS_AT_ONCE at most."""
        loop = asyncio.get_running_loop()
        while len(self._connects) < min(len(self._waiters), CONNECTS_AT_ONCE):
            task = loop.create_task(self._connect())
            self._connects.add(task)
            task.add_done_callback(self._connected)

    def _connected(self, task: asyncio.Task[_Connection]) -> None:
        self._connects.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            self._release(task.result(), reused=False)
        else:  # the oldest waiter gets the error; the next ones get connects of their own
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(exc)
                    break
        if self._waiters:
            self._open_for_waiters()

    async def _connect(self) -> _Connection:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=2**24), self.connect_timeout_s
            )
        except (OSError, TimeoutError) as exc:
            if local_cause(exc) is not None:
                raise LocalResourceError(
                    f"cannot open a connection to {self.host}:{self.port}: {exc!r}"
                ) from exc
            raise EngineUnavailable(f"{self.host}:{self.port} unreachable: {exc!r}") from exc
        return _Connection(reader, writer)

    def _release(self, conn: _Connection, reused: bool = True) -> None:
        """A free connection goes to the oldest waiter, else back to the idle ones."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result((conn, reused))
                return
        if len(self._idle) >= self.max_idle:
            conn.close()
        else:
            self._idle.append(conn)

    @staticmethod
    async def _read(conn: _Connection) -> HttpResponse:
        header = await conn.reader.readuntil(b"\r\n\r\n")
        lines = header[:-4].split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        if "content-length" in headers:
            content = await conn.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await conn.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                chunk = await conn.reader.readexactly(size + 2)
                if size == 0:
                    break
                parts.append(chunk[:-2])
            content = b"".join(parts)
        else:  # no length: the body runs to the end of the connection
            content = await conn.reader.read()
            headers["connection"] = "close"
        return HttpResponse(status, headers, content)

    def close(self) -> None:
        """Close idle connections and stop opening new ones; requests still waiting for one fail."""
        while self._idle:
            self._idle.pop().close()
        for task in self._connects:
            task.cancel()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(EngineUnavailable(f"{self.host}:{self.port}: the client was closed"))

"""A lean HTTP/1.1 keep-alive client for the engine API's request/response calls.

httpx's connection pool re-checks every pooled connection (a syscall each) on every request, which made the router
quadratic in its concurrency (benchmarks/router.py: 1,100 requests/s at 1 concurrent, 370 at 256). This pool hands
out idle connections in O(1) and parses responses with plain stream reads. Streaming responses still use httpx.
"""

from __future__ import annotations

import asyncio
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


class HttpPool:
    """Keep-alive connections to one ``http://host:port``; any number of concurrent requests."""

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
        # requests in flight (so connections, file descriptors, stay bounded), and connections opened at once
        # (so a burst does not overflow the server's accept backlog)
        self._open, self._connecting = asyncio.Semaphore(max_open), asyncio.Semaphore(64)
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
                    if (
                        response.headers.get("connection", "").lower() == "close"
                        or len(self._idle) >= self.max_idle
                    ):
                        conn.close()
                    else:
                        self._idle.append(conn)
                    return response
        except TimeoutError as exc:
            raise EngineUnavailable(
                f"{self.host}:{self.port}{path} timed out after {self.timeout_s:.0f} s"
            ) from exc

    async def _acquire(self) -> tuple[_Connection, bool]:
        while self._idle:
            conn = self._idle.pop()
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                return conn, True
            conn.close()
        try:
            async with self._connecting:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port, limit=2**24), self.connect_timeout_s
                )
        except (OSError, TimeoutError) as exc:
            if local_cause(exc) is not None:
                raise LocalResourceError(
                    f"cannot open a connection to {self.host}:{self.port}: {exc!r}"
                ) from exc
            raise EngineUnavailable(f"{self.host}:{self.port} unreachable: {exc!r}") from exc
        return _Connection(reader, writer), False

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
        """Close idle connections."""
        while self._idle:
            self._idle.pop().close()

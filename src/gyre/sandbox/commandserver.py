"""The driver's end of a sandbox's command server (``server.c``): one long-lived bubblewrap per sandbox, whose pid 1
runs each command on request, instead of a new bubblewrap per command.

A command then costs a message, two forks in the sandbox and an exec (about 1 ms), not a new set of namespaces
(about 5 ms of bwrap alone), and the driver starts one process per sandbox instead of one per command. What a
command sees and may do is unchanged (`gyre.sandbox.bwrap`): the server starts under the same launcher and
bubblewrap, so every command inherits the namespaces, the seccomp filter, the rlimits (per process, so each
command's own), the cgroups and the sandbox's uid. What per-command namespaces gave, the server keeps: a background
process dies with the command that started it (each command runs under a subreaper that kills what is left), and
``/dev/shm`` and SysV IPC are emptied whenever no command runs. Commands of one sandbox do share its network, IPC
and pid namespaces while they run together.

The server is started by the first command, stopped after ``sandbox.server_idle_s`` without one (the next command
starts it again: the workspace and ``/tmp`` are host directories, nothing is lost), and at close. Its messages are
framed (`_HEADER`); the driver trusts nothing in them beyond their framing, and a malformed or oversized frame ends
the server. Should it die, the commands it was running end as killed (exit 137) and the next one starts a new
server.

The server is C, built once from its source by the host's C compiler into a cache (`binary`): a Python server
would hold about 4 MB of private memory per sandbox, 40 GB at 10,000 executions. Without a compiler, sandboxes run
each command in its own bubblewrap, as before, and a warning says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import logging
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

from gyre.errors import SandboxError
from gyre.sandbox.process import Capture, Child, RawExit, Running, spawn, terminate

log = logging.getLogger(__name__)

PROTOCOL = b"gyre-sandbox-server 1"
INSIDE = (
    "/run/gyre-sandbox-server"  # where a sandbox sees the server (/run/gyre holds a command agent's socket)
)
RUN, STDIN, KILL = 1, 2, 3
HELLO, OUT, ERR, EXIT = 64, 65, 66, 67
_HEADER = struct.Struct("<IIB")  # payload length, command id, type
_EXIT = struct.Struct("<iQQ")  # exit code, stdout bytes, stderr bytes
_MAX_FRAME = 1 << 20  # the server's frames: output chunks of at most 64 KiB
_STDIN_CHUNK = 1 << 20
START_TIMEOUT_S = 30.0  # from spawning the launcher to the server's hello
KILL_WAIT_S = 1.0  # after a KILL, how long the server may take to report the command's end
LOST_EXIT = 137  # a command whose server died reports death by SIGKILL


def _source() -> bytes:
    return (Path(__file__).parent / "server.c").read_bytes()


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gyre" / "bin"


@functools.cache
def binary() -> str | None:
    """The server's executable, compiled on first use into the cache (keyed by its source's hash); None, with a
    warning, when no C compiler works here (blocking: a driver calls it at start-up, `gyre.sandbox.check_backend`).
    """
    source = _source()
    target = _cache_dir() / f"sandbox-server-{hashlib.sha256(source).hexdigest()[:16]}"
    if target.is_file() and os.access(target, os.X_OK):
        return str(target)
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        _warn_per_command("no C compiler (cc) to build the sandbox's command server")
        return None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            src, out = Path(tmp, "server.c"), Path(tmp, "server")
            src.write_bytes(source)
            done = subprocess.run(
                [compiler, "-O2", "-o", str(out), str(src)], capture_output=True, text=True, timeout=120
            )
            if done.returncode != 0:
                _warn_per_command(
                    f"{compiler} could not build the command server: {done.stderr.strip()[-500:]}"
                )
                return None
            out.chmod(0o755)
            os.replace(out, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        _warn_per_command(f"cannot build the command server in {target.parent}: {exc}")
        return None
    return str(target)


def _warn_per_command(reason: str) -> None:
    log.warning("%s; each sandboxed command starts its own bubblewrap (about 5 ms more per command)", reason)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class ServerLost(Exception):
    """The server ended (or was ended) while a command ran."""


class _Command:
    def __init__(self, limit: int) -> None:
        self.stdout = Capture(limit)
        self.stderr = Capture(limit)
        self.done: asyncio.Future[tuple[int, int, int]] = asyncio.get_running_loop().create_future()


_starting: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def start_slots(limit: int) -> asyncio.Semaphore:
    """The running loop's slots for servers starting at once (``limit`` of them, or the CPU count if 0; the first
    caller on a loop sets the number)."""
    loop = asyncio.get_running_loop()
    slots = _starting.get(loop)
    if slots is None:
        slots = _starting[loop] = asyncio.Semaphore(limit or len(os.sched_getaffinity(0)))
    return slots


class CommandServer:
    """One sandbox's running server: `run` commands through it; `close` ends it and everything it started."""

    def __init__(self, child: Child, sock: socket.socket, running: Running) -> None:
        self._child = child
        self._sock = sock
        self._running = running
        self._loop = asyncio.get_running_loop()
        self._buffer = bytearray()
        self._commands: dict[int, _Command] = {}
        self._ids = itertools.count(1)
        self._write_lock = asyncio.Lock()
        self._hello: asyncio.Future[None] = self._loop.create_future()
        self._said = bytearray()  # what came before the hello: the launcher's or bwrap's complaint
        self.closed = False
        self._loop.add_reader(sock.fileno(), self._readable)
        self._reaper = asyncio.ensure_future(self._reap())

    @classmethod
    async def start(
        cls, argv: Sequence[str], env: Mapping[str, str], running: Running, slots: asyncio.Semaphore
    ) -> CommandServer:
        """Spawn the launcher whose bubblewrap runs the server (``argv``) and wait for its hello, once one of
        ``slots`` is free (`start_slots`; the wait does not count against `START_TIMEOUT_S`)."""
        async with slots:
            return await cls._start(argv, env, running)

    @classmethod
    async def _start(cls, argv: Sequence[str], env: Mapping[str, str], running: Running) -> CommandServer:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            fd = theirs.fileno()
            child = await spawn(argv, env=env, cwd="/", stdin=fd, stdout=fd, stderr=fd)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        running.add(child)
        ours.setblocking(False)
        server = cls(child, ours, running)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await asyncio.shield(server._hello)
        except BaseException as exc:
            await server.close()
            said = server._said.decode(errors="replace").strip()
            if isinstance(exc, ServerLost):
                raise SandboxError(
                    said or f"the sandbox's command server exited ({child.returncode})"
                ) from None
            if isinstance(exc, TimeoutError):
                raise SandboxError(
                    f"the sandbox's command server did not start in {START_TIMEOUT_S:g} s"
                ) from None
            raise
        return server

    async def _reap(self) -> None:
        await self._child.wait()
        self._running.discard(self._child)
        self._lost()

    # -- reading ------------------------------------------------------------------------------------------

    def _readable(self) -> None:
        try:
            data = self._sock.recv(1 << 18)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._lost()
            return
        if not self._hello.done():
            self._said += data
            if not self._said.startswith(_HEADER.pack(len(PROTOCOL), 0, HELLO) + PROTOCOL):
                if len(self._said) > 1 << 16:  # not a server talking: keep the start of it for the error
                    del self._said[1 << 16 :]
                return
            self._hello.set_result(None)
            data = bytes(self._said[_HEADER.size + len(PROTOCOL) :])
            self._said.clear()
        self._buffer += data
        buffer, offset = self._buffer, 0
        try:
            while len(buffer) - offset >= _HEADER.size:
                size, ident, kind = _HEADER.unpack_from(buffer, offset)
                if size > _MAX_FRAME:
                    raise ValueError(f"a frame of {size} bytes")
                if len(buffer) - offset - _HEADER.size < size:
                    break
                payload = bytes(buffer[offset + _HEADER.size : offset + _HEADER.size + size])
                offset += _HEADER.size + size
                self._dispatch(ident, kind, payload)
        except (ValueError, struct.error) as exc:
            log.error("sandbox command server: %s; stopping it", exc)
            self._lost()
            return
        del buffer[:offset]

    def _dispatch(self, ident: int, kind: int, payload: bytes) -> None:
        command = self._commands.get(ident)
        if command is None:
            return  # a command the driver stopped waiting for
        if kind == OUT:
            command.stdout.feed(payload)
        elif kind == ERR:
            command.stderr.feed(payload)
        elif kind == EXIT:
            code, out_total, err_total = _EXIT.unpack(payload)
            del self._commands[ident]
            if not command.done.done():
                command.done.set_result((code, out_total, err_total))
        else:
            raise ValueError(f"a frame of unknown type {kind}")

    def _lost(self) -> None:
        """The server is gone (or must go): every command waiting on it ends."""
        if not self.closed:
            self.closed = True
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            if not self._hello.done():
                self._hello.set_exception(ServerLost())
            for command in self._commands.values():
                if not command.done.done():
                    command.done.set_exception(ServerLost())
            self._commands.clear()

    # -- writing ------------------------------------------------------------------------------------------

    async def _send(self, ident: int, kind: int, payload: bytes = b"") -> None:
        data = _HEADER.pack(len(payload), ident, kind) + payload
        async with self._write_lock:
            view = memoryview(data)
            while view:
                if self.closed:
                    raise ServerLost()
                try:
                    sent = self._sock.send(view)
                except (BlockingIOError, InterruptedError):
                    await self._writable()
                    continue
                except OSError:
                    self._lost()
                    raise ServerLost() from None
                view = view[sent:]

    async def _writable(self) -> None:
        ready = self._loop.create_future()
        fd = self._sock.fileno()
        self._loop.add_writer(fd, functools.partial(_settle, ready))
        try:
            await ready
        finally:
            if not self.closed:
                self._loop.remove_writer(fd)

    # -- commands -----------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Whether a command is running."""
        return bool(self._commands)

    async def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        stdin: bytes | None,
        timeout_s: float,
        output_limit_bytes: int,
    ) -> RawExit:
        """Run one command; its exit, output and timing as `gyre.sandbox.process.run_process` reports them.

        A command still running at ``timeout_s`` is killed with everything it started; so is one whose caller is
        cancelled. If the server dies meanwhile, the command reports death by SIGKILL.
        """
        ident = next(self._ids)
        command = _Command(output_limit_bytes)
        strings = [cwd, *argv, *(f"{k}={v}" for k, v in env.items())]
        head = struct.pack("<QBII", output_limit_bytes, stdin is not None, len(argv), len(env))
        payload = head + b"".join(s.encode() + b"\0" for s in strings)
        start = time.perf_counter()
        self._commands[ident] = command
        timed_out = False
        try:
            try:
                await self._send(ident, RUN, payload)
                if stdin is not None:
                    for at in range(0, len(stdin), _STDIN_CHUNK):
                        await self._send(ident, STDIN, stdin[at : at + _STDIN_CHUNK])
                    await self._send(ident, STDIN)
                async with asyncio.timeout(timeout_s):
                    code, out_total, err_total = await asyncio.shield(command.done)
            except TimeoutError:
                timed_out = True
                code, out_total, err_total = await self._stop(ident, command)
            except asyncio.CancelledError:
                with contextlib.suppress(ServerLost):
                    await asyncio.shield(self._stop(ident, command))
                raise
        except ServerLost:
            code, out_total, err_total = LOST_EXIT, command.stdout.total, command.stderr.total
            command.stderr.feed(b"\ngyre: the sandbox's command server ended while the command ran\n")
        duration = time.perf_counter() - start
        command.stdout.total = max(command.stdout.total, out_total)
        command.stderr.total = max(command.stderr.total, err_total)
        return RawExit(
            returncode=code,
            stdout=command.stdout,
            stderr=command.stderr,
            timed_out=timed_out,
            duration_s=duration,
        )

    async def _stop(self, ident: int, command: _Command) -> tuple[int, int, int]:
        """Kill a command; if the server does not report its end soon, kill the server too."""
        with contextlib.suppress(ServerLost):
            await self._send(ident, KILL)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(KILL_WAIT_S):
                    return await asyncio.shield(command.done)
        log.warning(
            "a sandbox's command server did not end a command it was told to kill; killing the server"
        )
        await self.close()
        raise ServerLost()

    async def close(self) -> None:
        """End the server: it kills everything in the sandbox and exits; a server that does not is killed."""
        self._lost()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(KILL_WAIT_S):
                await self._child.wait()
        if self._child.returncode is None:
            await terminate(self._child, children_first=True)

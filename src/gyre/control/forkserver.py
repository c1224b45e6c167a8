"""Start Gyre's own processes (cells, engines, routers, trainers, ranks) either as fresh interpreters or, when a fork
server is running, forked from one that already imported torch, transformers and Gyre.

A fresh ``python -m gyre ...`` spends 2-3.5 CPU-seconds importing torch and transformers before it does anything;
a run or a test that starts hundreds of such processes on a small machine spends most of its time there. A fork
server (``python -m gyre.control.forkserver SOCKET``) imports them once; `spawn` asks it to fork a child that runs the
requested module exactly as ``python -m`` would, with the caller's standard streams, environment and working
directory. `spawn` gives back a `Process` with ``subprocess.Popen``'s semantics (pid, poll, wait, kill,
send_signal, stdin, returncode); the server reports the child's exit status over the connection the caller holds,
and a child started with ``die_with_parent`` is killed when that connection closes (its caller died), as
PR_SET_PDEATHSIG would. The child rewrites its command line (``/proc/PID/cmdline``, ``ps``) to the one requested.
It ends as an interpreter ends (threads joined, atexit handlers run, open files flushed) less the teardown of every
module, which takes a second with torch loaded; the server freezes what it imported (``gc.freeze``), so neither the
children's collections nor that exit copy the memory they share with it.

`spawn` uses the server named by ``GYRE_FORKSERVER`` (a Unix socket path) when it is set, the command is
``sys.executable -m gyre[.module] ...`` and the environment asked for differs from the server's in nothing that
torch, transformers or the interpreter read at import (threads, devices, hub settings, ``PYTHON*``); otherwise, or
when the server does not answer, it starts the process with ``subprocess.Popen``, as without a server. The test
suite runs one server per worker (``tests/suite_plan.py``); a user may start one for a driver that restarts many
local processes. A fork server never initialises CUDA (it only imports), so its children may.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import io
import json
import os
import runpy
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn, Protocol

ENV = "GYRE_FORKSERVER"
# what a fork server imports before it serves (a module missing here is skipped)
PRELOAD = (
    "torch",
    "torch.distributed",
    "transformers",
    "transformers.configuration_utils",
    "transformers.models.qwen3.modeling_qwen3",
    "gyre.cli",
    "gyre.config",
    "gyre.control.cellprocess",
    "gyre.router.app",
    "gyre.router.routing",
    "gyre.engine.embedded.api",
    "gyre.engine.embedded.transformer",
    "gyre.train.state",
    "gyre.train.trainerclient",
    "gyre.train.corecell",
)
# environment variables read when those modules are imported or the interpreter starts: a child asking for other
# values than the server's must be a fresh interpreter
IMPORT_TIME_ENV = ("OMP_", "MKL_", "KMP_", "OPENBLAS_", "GOMP_", "CUDA_", "NVIDIA_", "TORCH", "PYTORCH_", "HF_",
                   "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "PYTHON", "LD_", "MALLOC_", "GLIBC_")  # fmt: skip
_TITLE_ROOM = 4096  # bytes of command line a child can show (the server is started with that much)
_CONNECT_TIMEOUT_S = 120.0  # a server still importing accepts once it is ready
_PR_SET_PDEATHSIG = 1


class Process(Protocol):
    """What callers need of a started process (``subprocess.Popen`` has it)."""

    pid: int
    args: Any
    stdin: IO[bytes] | None

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...

    def terminate(self) -> None: ...

    def send_signal(self, sig: int) -> None: ...


def exit_with_parent() -> None:
    """(in the child, before exec) Be killed when the thread that started us ends, e.g. a cell process killed."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


# ---- the caller's side -------------------------------------------------------------------------------------------
def spawn(
    argv: list[str],
    *,
    stdin: int | IO[bytes] | None = None,
    stdout: int | IO[bytes] | None = None,
    stderr: int | IO[bytes] | None = None,
    env: Mapping[str, str] | None = None,
    die_with_parent: bool = False,
) -> Process:
    """Start ``argv`` like ``subprocess.Popen(argv, stdin=..., stdout=..., stderr=..., env=...)``, forked from the
    fork server when one serves and the command allows it. ``stdin`` may be ``subprocess.PIPE`` (then the returned
    process's ``stdin`` is the writing end); ``stderr`` may be ``subprocess.STDOUT``. ``die_with_parent``: the
    process is killed when the calling thread (fresh) or process (forked) ends."""
    server = os.environ.get(ENV)
    full_env = dict(os.environ if env is None else env)
    module = _module_of(argv)
    if server and module is not None:
        with contextlib.suppress(OSError, ValueError):
            return _ForkedProcess.start(
                server, argv, module, stdin, stdout, stderr, full_env, die_with_parent
            )
    return subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, env=full_env,
                            preexec_fn=exit_with_parent if die_with_parent else None)  # fmt: skip


def _module_of(argv: list[str]) -> str | None:
    """The Gyre module ``argv`` runs with ``python -m``, when it runs one with this interpreter and no other flag."""
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m":
        name = argv[2]
        if name == "gyre" or name.startswith("gyre."):
            return name
    return None


def _import_time_differs(
    env: Mapping[str, str], base: Mapping[str, str], added: Mapping[str, str]
) -> list[str]:
    """The variables read at import or start-up whose value in ``env`` is neither ``base``'s (the server's as it
    started) nor the one its imports set (``added``)."""
    keys = {k for k in (*env, *base) if k.startswith(IMPORT_TIME_ENV)}
    return sorted(k for k in keys if env.get(k) not in (base.get(k), added.get(k, base.get(k))))


def _fd(stream: int | IO[bytes] | None, default: int, opened: list[int]) -> int:
    if stream is None:
        return default
    if stream == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        opened.append(fd)
        return fd
    if isinstance(stream, int):
        if stream < 0:
            raise ValueError(f"unsupported stream {stream}")
        return stream
    return stream.fileno()


class _ForkedProcess:
    """A child of the fork server; its exit status arrives on the connection ``self._fd`` (a bare descriptor: a socket
    object dropped in a reference cycle would warn before this handle's finalizer closed it)."""

    def __init__(self, sock: socket.socket, pid: int, args: list[str], stdin: IO[bytes] | None) -> None:
        self.pid, self.args, self.stdin = pid, args, stdin
        self._fd: int | None = sock.detach()
        self._code: int | None = None
        self._buffer = b""
        self._reading = (
            threading.Lock()
        )  # one thread at a time waits on the descriptor; others wait for that one

    @classmethod
    def start(
        cls,
        server: str,
        argv: list[str],
        module: str,
        stdin: int | IO[bytes] | None,
        stdout: int | IO[bytes] | None,
        stderr: int | IO[bytes] | None,
        env: dict[str, str],
        die_with_parent: bool,
    ) -> _ForkedProcess:
        opened: list[int] = []
        pipe_end: IO[bytes] | None = None
        try:
            if stdin == subprocess.PIPE:
                read_end, write_end = os.pipe()
                opened.append(read_end)
                pipe_end = open(write_end, "wb")  # noqa: SIM115 - the returned process's stdin
                in_fd = read_end
            else:
                in_fd = _fd(stdin, 0, opened)
            out_fd = _fd(stdout, 1, opened)
            err_fd = out_fd if stderr == subprocess.STDOUT else _fd(stderr, 2, opened)
            request = json.dumps({"module": module, "args": argv[3:], "argv": argv, "cwd": os.getcwd(), "env": env,
                                  "die": die_with_parent, "executable": sys.executable}).encode()  # fmt: skip
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(_CONNECT_TIMEOUT_S)
                sock.connect(server)
                socket.send_fds(sock, [struct.pack("<Q", len(request))], [in_fd, out_fd, err_fd])
                sock.sendall(request)
                reply = _read_line(sock)
                if "pid" not in reply:
                    raise ValueError(f"the fork server refused: {reply.get('error')}")
                sock.settimeout(None)
            except BaseException:
                sock.close()
                raise
        except BaseException:
            if pipe_end is not None:
                pipe_end.close()
            raise
        finally:
            for fd in opened:
                os.close(fd)
        return cls(sock, int(reply["pid"]), argv, pipe_end)

    @property
    def returncode(self) -> int | None:
        return self._code

    def poll(self) -> int | None:
        return self._check(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._check(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def _check(self, timeout: float | None) -> int | None:
        if self._code is not None:
            return self._code
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._reading.acquire(timeout=-1 if timeout is None else timeout):
            return self._code  # another thread waits on the descriptor, and it has not ended yet
        try:
            assert self._fd is not None  # open until the code is known
            waiting = select.poll()  # not select(): a busy process's descriptors pass FD_SETSIZE
            waiting.register(self._fd, select.POLLIN)
            while self._code is None:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not waiting.poll(None if left is None else left * 1000):
                    return None
                try:
                    data = os.read(self._fd, 4096)
                except OSError:
                    data = b""
                if not data:  # the server died: it takes its children along (PR_SET_PDEATHSIG)
                    self._code = -signal.SIGKILL
                    break
                self._buffer += data
                if b"\n" in self._buffer:
                    self._code = int(json.loads(self._buffer.split(b"\n", 1)[0])["exit"])
            self._close()  # only the thread holding the lock ever waits on it
            return self._code
        finally:
            self._reading.release()

    def _close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __repr__(self) -> str:
        return f"<forked process {self.pid} returncode: {self._code}>"

    def __del__(self) -> None:  # a child asked to die with its caller that still runs dies with this handle
        with contextlib.suppress(Exception):
            self._close()


def _read_line(sock: socket.socket) -> dict[str, Any]:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise OSError("the fork server closed the connection")
        data += chunk
    reply: dict[str, Any] = json.loads(data)
    return reply


# ---- the server --------------------------------------------------------------------------------------------------
@dataclass
class _Job:
    """What a forked child runs: ``python -m module args`` as asked."""

    module: str
    argv: list[str]
    args: Any
    cwd: str
    env: dict[str, str]
    fds: list[int]

    def run(self, server: int) -> NoReturn:
        """Become the requested process (in the child of ``server``, right after the fork); exits when it ends."""
        _set_cmdline(self.argv)
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # dies with the server
        if os.getppid() != server:  # it died before that took hold
            os._exit(1)
        for target, fd in enumerate(self.fds):
            os.dup2(fd, target)
        for fd in set(self.fds):
            if fd > 2:
                os.close(fd)
        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.env)
        sys.argv = [self.argv[0], *self.args]
        # buffered as a fresh interpreter's would be: by lines on a terminal, in blocks otherwise
        with contextlib.suppress(AttributeError, ValueError, OSError):
            sys.stdout.reconfigure(line_buffering=sys.stdout.isatty())  # type: ignore[union-attr]
        # the module may have been imported by the server: run afresh as __main__, like python -m after an import
        warnings.filterwarnings("ignore", message=".*found in sys.modules after import of package", category=RuntimeWarning)  # fmt: skip
        try:
            runpy.run_module(self.module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as stop:
            code = _exit_status(stop.code)
        except KeyboardInterrupt:  # as the interpreter ends on one: killed by SIGINT
            _finish(None)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            code = 1
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
        _finish(code)
        os._exit(code)  # (not reached)


def _exit_status(code: object) -> int:
    """The status ``raise SystemExit(code)`` ends an interpreter with (a message is printed, as it would be)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _finish(code: int | None) -> None:
    """End as the interpreter ends, less its teardown of every module (a second or more with torch loaded; the
    kernel frees that memory anyway): join the threads that are not daemons, run the atexit handlers (logging's
    flush, finalizers, temporary directories), flush every open file, then exit with ``code``."""
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter calls first when it exits
    atexit._run_exitfuncs()
    writers = (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)
    for obj in gc.get_objects():
        if issubclass(type(obj), writers):  # type(), not isinstance: a proxy's __class__ may warn or raise
            with contextlib.suppress(Exception):
                obj.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code is not None:
        os._exit(code)


class ForkServer:
    """Accepts spawn requests on a Unix socket and forks a child for each; reports each child's exit status."""

    def __init__(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(128)  # callers connect now and are answered once the imports are done
        self.pid = os.getpid()
        self.children: dict[int, socket.socket | None] = {}  # pid -> its caller's connection (None: gone)
        self.die: dict[socket.socket, int] = {}  # connection -> pid to kill when it closes
        self.base_env = dict(os.environ)  # as started: what a child's environment is compared with
        # what the imports added (torch's sets TORCHINDUCTOR_CACHE_DIR): a child gets it as if it imported them
        self.set_by_imports: dict[str, str] = {}

    def serve(self, preload: tuple[str, ...] = PRELOAD) -> _Job:
        """Import ``preload``, then serve until killed; returns only in a forked child, with its job."""
        for name in preload:
            with contextlib.suppress(ImportError):
                __import__(name)
        self.set_by_imports = {k: v for k, v in os.environ.items() if k not in self.base_env}
        # what the imports made is never collected again: a child's collections (and its exit's scan for open files,
        # `_finish`) do not touch, so do not copy, the pages it shares with the server
        gc.freeze()
        # a fork copies only the forking thread: a Python thread here could leave a lock held in every child.
        # (Native pools are another matter: OpenBLAS, started by numpy's import, shuts its pool down at fork.)
        if threading.active_count() != 1:
            names = [t.name for t in threading.enumerate()]
            raise SystemExit(
                f"gyre.control.forkserver: Python threads {names} run after the imports; refusing to fork"
            )
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ)
        sel.register(wake_r, selectors.EVENT_READ)
        while True:
            for key, _ in sel.select():
                if key.fileobj is self.listener:
                    job = self._accept(sel)
                    if job is not None:  # the child
                        sel.close()
                        for fd in (wake_r, wake_w):
                            os.close(fd)
                        return job
                elif key.fileobj == wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 512)
                    self._reap(sel)
                else:
                    conn = key.fileobj
                    assert isinstance(conn, socket.socket)
                    self._closed(sel, conn)

    def _accept(self, sel: selectors.BaseSelector) -> _Job | None:
        conn, _ = self.listener.accept()
        fds: list[int] = []
        try:
            conn.settimeout(10.0)
            head, fds, _, _ = socket.recv_fds(conn, 8, 3)
            (size,) = struct.unpack("<Q", head)
            body = b""
            while len(body) < size:
                chunk = conn.recv(min(size - len(body), 1 << 20))
                if not chunk:
                    raise OSError("the caller hung up")
                body += chunk
            request = json.loads(body)
            uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
            refusal = (
                f"the caller runs as uid {uid}, this server as {os.getuid()}" if uid != os.getuid()
                else f"this server runs {sys.executable}" if request["executable"] != sys.executable
                else "three descriptors (stdin, stdout, stderr) are needed" if len(fds) != 3
                else f"{', '.join(differ)} differ from this server's: the child must start afresh"
                if (differ := _import_time_differs(request["env"], self.base_env, self.set_by_imports)) else ""
            )  # fmt: skip
            if refusal:
                print(
                    f"gyre.control.forkserver: refused {request.get('argv')}: {refusal}",
                    file=sys.stderr,
                    flush=True,
                )
                conn.sendall(json.dumps({"error": refusal}).encode() + b"\n")
                raise OSError(refusal)
        except (OSError, ValueError, KeyError, struct.error):
            for fd in fds:
                os.close(fd)
            conn.close()
            return None
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for other in (self.listener, conn, *self.children.values()):
                if other is not None:
                    other.close()
            env = {**self.set_by_imports, **request["env"]}  # as if the child had imported them itself
            return _Job(request["module"], request["argv"], request["args"], request["cwd"], env, fds)
        for fd in fds:
            os.close(fd)
        try:
            conn.settimeout(None)
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError:
            os.kill(pid, signal.SIGKILL)  # nobody holds it: it must not run unwatched
        self.children[pid] = conn
        if request["die"]:
            self.die[conn] = pid
        sel.register(conn, selectors.EVENT_READ)
        return None

    def _reap(self, sel: selectors.BaseSelector) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:  # not ours, or its caller went away
                continue
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            self._forget(sel, conn)

    def _closed(self, sel: selectors.BaseSelector, conn: socket.socket) -> None:
        """The caller's side of a connection is readable: it closed (it sends nothing after the request)."""
        try:
            if conn.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK):
                conn.recv(4096)  # a caller has nothing to say; ignore it
                return
        except BlockingIOError:  # a spurious wake-up: nothing there, and not closed
            return
        except OSError:  # reset: gone as surely as closed
            pass
        for pid, held in self.children.items():
            if held is conn:
                if conn in self.die:  # dies with its caller, as with PR_SET_PDEATHSIG
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self.children[pid] = None  # it runs on; its exit status goes nowhere
        self._forget(sel, conn)

    def _forget(self, sel: selectors.BaseSelector, conn: socket.socket) -> None:
        self.die.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn)
        conn.close()


def _set_cmdline(argv: list[str]) -> None:
    """Show ``argv`` as this process's command line (``/proc/self/cmdline``, ``ps``), within the room the process
    started with: the bytes of its original arguments are overwritten, as setproctitle does."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: fields 48 and 49 of proc(5)
    except (OSError, IndexError, ValueError):
        return
    room = end - start
    if room <= 1:
        return
    words = b"\0".join(os.fsencode(a) for a in argv)[: room - 1]
    ctypes.memmove(start, words.ljust(room, b"\0"), room)


def start_server(path: str, log: str | None = None) -> subprocess.Popen[bytes]:
    """Start a fork server at ``path`` that dies with the calling thread; callers may connect at once (they are
    answered once it has imported `PRELOAD`). Set ``GYRE_FORKSERVER=path`` for the processes that should use it."""
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
    try:
        proc = subprocess.Popen([sys.executable, "-m", "gyre.control.forkserver", path, "x" * _TITLE_ROOM],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=exit_with_parent)  # fmt: skip
    finally:
        if log:
            out.close()  # type: ignore[union-attr]
    for _ in range(200):  # it binds before it imports: wait for the socket, not the imports
        if os.path.exists(path) or proc.poll() is not None:
            break
        time.sleep(0.01)
    return proc


def describe(names: list[str]) -> None:
    """``python -m gyre.control.forkserver --describe [NAME...]``: print what this process was given (working directory,
    the variables ``NAME``, standard input, whether a fork server started it) as JSON, to check a server's
    children against fresh interpreters."""
    forked = "torch" in sys.modules  # a fresh interpreter running this module has not imported torch
    seen = json.dumps({"cwd": os.getcwd(), "env": {n: os.environ.get(n) for n in names}, "forked": forked,
                       "stdin": sys.stdin.read(), "argv": sys.argv[1:]})  # fmt: skip
    print(seen, flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if path := os.environ.get("GYRE_DESCRIBE_TO"):  # left open and unflushed, as careless code leaves a file:
        _left_open.append(open(path, "w"))  # noqa: SIM115 - the interpreter's exit must flush it
        _left_open[-1].write(seen)


_left_open: list[IO[str]] = []


def main(argv: list[str] | None = None) -> None:
    """``python -m gyre.control.forkserver SOCKET [ROOM]``: serve spawn requests at SOCKET until killed."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--describe"]:
        describe(args[1:])
        return
    if not args:
        raise SystemExit("usage: python -m gyre.control.forkserver SOCKET | --describe [NAME...]")
    server = ForkServer(args[0])
    _set_cmdline([sys.executable, "-m", "gyre.control.forkserver", args[0]])
    job = server.serve()
    job.run(server.pid)


if __name__ == "__main__":
    main()

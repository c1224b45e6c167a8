"""The default backend: each command runs in fresh bubblewrap namespaces over the sandbox's workspace.

What a command sees and may do:

- its own user, pid, network, IPC, UTS and cgroup namespaces: no network but loopback (unless ``network =
  true`` shares the host's), no process of the host, hostname ``gyre``;
- uid 0 inside, which on the host is never a privileged uid: under a root driver each sandbox runs as an
  unprivileged uid of its own (``setpriv`` before bwrap, see `gyre.sandbox.limits.own_uid`), which owns its
  workspace and ``/tmp`` while it is open (a given workspace gets its owners back at close); otherwise the
  driver's uid. Paths that uid cannot reach (under ``/root``, say) are bound first in a mount namespace of the
  launcher's own, where it can;
- no capabilities (``--cap-drop ALL``), no_new_privs, and no nested user namespaces (``--disable-userns``);
- a seccomp filter (`gyre.sandbox.seccomp`): no setuid/setgid bits or device nodes, no kernel keyrings (the
  driver's session keyring is inherited), no io_uring, bpf or userfaultfd;
- no descriptor of the driver's but stdin, stdout and stderr (the launcher closes the rest);
- the system read-only: ``/usr``, the ``/bin`` and ``/lib*`` links, and a curated copy of ``/etc`` (no shadow
  files, host keys or package credentials); a read-only root, a fresh read-only ``/proc`` (``/proc/sys`` and the
  other kernel knobs in it included), a minimal read-only ``/dev`` (its ``/dev/shm`` writable, as large as the
  sandbox's memory); every mount nosuid and nodev;
- the workspace read-write at ``/workspace`` (its home and default cwd), and the sandbox's own ``/tmp`` (a host
  directory private to the sandbox, so that files there last from one command to the next);
- a scrubbed environment: PATH, HOME, LANG, TERM, TMPDIR and what the caller passes, nothing of the driver's.

Commands run through the sandbox's command server (`gyre.sandbox.commandserver`): one bubblewrap per sandbox, started by
its first command, whose pid 1 forks each command under a keeper that kills whatever the command leaves behind when
it exits (daemons included), and empties ``/dev/shm`` and SysV IPC whenever no command runs; the timeout, a
cancellation or the sandbox's closing kill the command's whole tree, and ``--die-with-parent`` ends it all if the
driver dies. A background server thus lives as long as the command that started it. With ``command_server =
false`` (or no C compiler to build the server) each command gets new namespaces of its own instead, with a small
``sh`` as their pid 1 and the command as its child. Measured on the 2-core dev VM (`benchmarks/runtime.py`): `true`
costs about 1 ms more than a plain subprocess through the server, against 6-7 ms with a bubblewrap per command.
Issue 14's containment (the launcher's bash, setpriv, an unprivileged user namespace, the seccomp filter) costs
about 4 ms more at each bubblewrap's start.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fnmatch
import functools
import logging
import os
import posixpath
import random
import shutil
import stat
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from gyre.config import SandboxConfig
from gyre.errors import SandboxError
from gyre.sandbox import commandserver, filetree, limits, seccomp
from gyre.sandbox.interface import WORKSPACE
from gyre.sandbox.process import RawExit
from gyre.sandbox.workspace import SYSTEM_PATH, HostSandbox

# /etc entries tools need (name resolution, libraries, certificates, locales, Debian alternatives, shells,
# language runtimes' config); nothing with secrets (shadow, ssh, sudoers, pip/npm credentials, ssl/private).
ETC_ALLOWED = (
    "passwd", "group", "hosts", "hostname", "nsswitch.conf", "host.conf", "gai.conf", "resolv.conf", "protocols",
    "services", "networks", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "locale.alias",
    "locale.conf", "default/locale", "ssl/certs", "ssl/openssl.cnf", "ca-certificates", "ca-certificates.conf",
    "pki/tls/certs", "pki/ca-trust", "alternatives", "bash.bashrc", "bashrc", "profile", "profile.d", "inputrc",
    "terminfo", "magic", "magic.mime", "mime.types", "os-release", "lsb-release", "debian_version", "shells",
    "login.defs", "python3*", "perl", "java*", "vim", "xdg",
)  # fmt: skip
log = logging.getLogger(__name__)
_TOP_LEVEL = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# pid 1 of each command's namespace (bwrap --as-pid-1): it runs the command as its child, so the command keeps
# ordinary signal semantics (a pid 1 ignores SIGXCPU, SIGTERM... it has no handler for), and exits with its
# status. Not bwrap's own init: bwrap exits before reaping it, leaving a zombie for the host's init, which in a
# container may be the driver itself, never reaping it. fd 3 carries stdin (sh gives a background job /dev/null).
_INIT = 'exec 3<&0; "$@" <&3 3<&- & wait $!'
_SECCOMP_FD = 3  # where the launcher opens the seccomp filter for bwrap (which closes it)
_SANDBOX_ENV = {"PATH": SYSTEM_PATH, "HOME": WORKSPACE, "LANG": "C.UTF-8", "TERM": "dumb", "TMPDIR": "/tmp"}


_etc_lock = threading.Lock()


@functools.cache
def _curated_etc() -> str:
    """A private copy of the allowed /etc entries, made once per process and removed at its exit.

    One read-only bind of this copy costs a fraction of binding each entry (about 6 ms a command for ~50 mounts).
    Symlinks stay symlinks; one that leads out of /usr and /etc is replaced by the file it names.
    """
    root = Path(tempfile.mkdtemp(prefix=f"gyre-etc-{os.getpid()}-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    root.chmod(0o755)  # uid containment: the sandbox's own uid reads it
    etc = sorted(os.listdir("/etc"))
    for pattern in ETC_ALLOWED:
        for name in fnmatch.filter(etc, pattern) if "*" in pattern else [pattern]:
            src, dest = Path("/etc", name), root / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                if src.is_symlink():
                    real = os.path.realpath(src)
                    if real.startswith(("/usr/", "/etc/")):
                        dest.symlink_to(os.readlink(src))
                    elif os.path.isfile(real):  # e.g. resolv.conf -> /run/...
                        shutil.copy2(real, dest)
                elif src.is_dir():
                    shutil.copytree(src, dest, symlinks=True)
                elif src.is_file():
                    shutil.copy2(src, dest)
            except OSError as exc:  # an unreadable entry is left out, not fatal
                log.debug("not copying %s into the sandbox /etc: %s", src, exc)
    (root / "mtab").symlink_to("../proc/self/mounts")
    return str(root)


def system_binds() -> list[str]:
    """The bwrap arguments that show the host's system read-only."""
    with _etc_lock:
        etc = _curated_etc()
    return [*_top_level_binds(), "--ro-bind", etc, "/etc"]


@functools.cache
def _top_level_binds() -> tuple[str, ...]:
    args: list[str] = []
    for name in _TOP_LEVEL:
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return tuple(args)


def bwrap_argv(
    cfg: SandboxConfig,
    workspace: str,
    tmp: str,
    argv: list[str],
    env: dict[str, str],
    cwd: str | None,
    binds: Sequence[tuple[str, str, bool]] = (),
    seccomp_fd: int | None = None,
    init: bool = True,
) -> list[str]:
    """bwrap's command line running ``argv`` over the host directories ``workspace`` and ``tmp``.

    ``binds`` adds host paths: (host path, path inside, writable). ``seccomp_fd``: a descriptor bwrap inherits,
    open on the seccomp filter it installs (`gyre.sandbox.seccomp`). ``init``: pid 1 is a small ``sh`` running
    ``argv`` as its child (see ``_INIT``); without it ``argv`` is pid 1 itself (the command server).
    """
    out = [
        limits.tool("bwrap"),
        "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--disable-userns", "--cap-drop", "ALL", "--uid", "0", "--gid", "0",
        "--die-with-parent", "--new-session", "--hostname", "gyre", "--as-pid-1",
    ]  # fmt: skip
    if not cfg.network:
        out.append("--unshare-net")
    out += system_binds()
    out += ["--proc", "/proc"]
    # /dev/shm: its own tmpfs, as large as the sandbox's memory (tmpfs pages escape RLIMIT_AS); the rest of /dev
    # read-only below, or a command could fill the host's memory through it
    out += ["--dev", "/dev", "--size", str(cfg.memory_mib * limits.MIB), "--tmpfs", "/dev/shm"]
    out += ["--bind", workspace, WORKSPACE, "--bind", tmp, "/tmp"]
    for host, inside, writable in binds:
        out += ["--bind" if writable else "--ro-bind", host, inside]
    # Read-only: the tmpfs bwrap builds (no stray writes, no memory outside the limits), and /proc, whose sysctls
    # and other kernel knobs no command may write (its own process's entries are read-only too).
    out += ["--remount-ro", "/", "--remount-ro", "/dev", "--remount-ro", "/proc"]
    if seccomp_fd is not None:
        out += ["--seccomp", str(seccomp_fd)]
    out.append("--clearenv")
    for key, value in {**_SANDBOX_ENV, **env}.items():
        out += ["--setenv", key, value]
    workdir = WORKSPACE if cwd is None else posixpath.normpath(posixpath.join(WORKSPACE, cwd))
    out += ["--chdir", workdir, "--"]
    return [*out, "/bin/sh", "-c", _INIT, "sh", *argv] if init else [*out, *argv]


class BwrapSandbox(HostSandbox):
    """A sandbox isolated by bubblewrap (see the module for what a command sees)."""

    isolated: ClassVar[bool] = True
    WORKSPACE = WORKSPACE
    _kill_children_first = True  # bwrap reaps its child (the command, pid 1 of the namespace) and exits

    def __init__(
        self,
        cfg: SandboxConfig,
        workspace: Path | None = None,
        binds: Sequence[tuple[str, str, bool]] = (),
        python_env: Path | None = None,
        variables: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(cfg, workspace, binds, python_env, variables)
        self._staged: dict[str, str] = {}  # host path -> where the launcher binds it for the sandbox's uid
        self._owners: dict[tuple[int, int], tuple[int, int]] = {}  # a given workspace's, before: see _remove
        # its command server (gyre.sandbox.commandserver): None until the first command, and after it stops
        self._server_binary = commandserver.binary() if cfg.command_server else None
        self._server: commandserver.CommandServer | None = None
        self._server_lock = asyncio.Lock()
        self._idle: asyncio.TimerHandle | None = None
        self._stopping: asyncio.Future[None] | None = None  # an idle server's ending
        self._ending = False  # closing: no server starts again

    def _prepare(self) -> None:
        system_binds()  # the first call copies /etc: here, in a thread, not on the loop
        if seccomp.filter_file() is None:
            _warn_no_seccomp()
        if not limits.own_uid(self.isolated):
            return
        # Its own unprivileged uid: never host root (and RLIMIT_NPROC holds). Its files must be that uid's, so
        # that it can write them; a given workspace gets its owners back at close.
        uid = random.randrange(100_000_000, 2_000_000_000)
        if self._given_workspace is not None:
            self._owners = _owners(self.workspace)
        self._owner = uid  # from here on, closing gives a given workspace back
        for top in (self.workspace, self.root / "tmp"):
            _chown_tree(top, uid)
        # bwrap, running as that uid, must reach every path it binds (it resolves even fds given to it back to
        # paths): those behind a directory others cannot search are bound first at a mount point it can reach.
        self.root.chmod(0o711)
        hosts = [str(self.workspace), str(self.root / "tmp"), *(h for h, _, _ in self.binds)]
        for host in hosts + ([self._server_binary] if self._server_binary else []):
            real = os.path.realpath(host)
            if host not in self._staged and not _reachable(real):
                point = _stage_root() / f"{self.id}-{len(self._staged)}"
                if os.path.isdir(real):
                    point.mkdir()
                else:
                    point.touch()
                self._staged[host] = str(point)

    def _shown_tmp(self) -> str:
        return "/tmp"

    def _launcher_prefix(self) -> list[str]:
        files = self._cgroup.procs_files if self._cgroup is not None else []
        memory_in_cgroup = self._cgroup is not None and self._cgroup.memory_limited
        staged = [(os.path.realpath(h), p) for h, p in self._staged.items()]
        prefix = limits.join_argv(files, seccomp.filter_file(), staged)
        if self.cfg.nice:  # below the driver: its loop gets the CPU before a busy sandbox does
            prefix += [limits.tool("nice"), f"--adjustment={self.cfg.nice}"]
        prefix += limits.prlimit_argv(self.cfg, self.containment, memory_in_cgroup)
        if self._owner is not None:  # setpriv rather than Popen(user=...), which uvloop does not support
            prefix += limits.setpriv_argv(self._owner)
        return prefix

    def _launch(
        self, argv: list[str], env: dict[str, str], cwd: str | None
    ) -> tuple[list[str], dict[str, str], str]:
        fd = _SECCOMP_FD if seccomp.filter_file() is not None else None
        workspace, tmp = (self._staged.get(str(p), str(p)) for p in (self.workspace, self.root / "tmp"))
        binds = [(self._staged.get(h, h), inside, writable) for h, inside, writable in self.binds]
        inner = bwrap_argv(self.cfg, workspace, tmp, argv, env, cwd, binds, fd)
        return self._launcher_prefix() + inner, {"PATH": SYSTEM_PATH}, "/"

    async def _run(
        self, argv: list[str], env: dict[str, str], cwd: str | None, stdin: bytes | None, timeout_s: float
    ) -> RawExit:
        if self._server_binary is None:
            return await super()._run(argv, env, cwd, stdin, timeout_s)
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        try:
            running = await self._command_server()
            workdir = WORKSPACE if cwd is None else posixpath.normpath(posixpath.join(WORKSPACE, cwd))
            return await running.run(
                argv, {**_SANDBOX_ENV, **env}, workdir, stdin, timeout_s, self.cfg.output_limit_bytes
            )
        finally:
            if self._server is not None and not self._server.busy and not self._ending:
                self._idle = asyncio.get_running_loop().call_later(self.cfg.server_idle_s, self._stop_idle)

    async def _command_server(self) -> commandserver.CommandServer:
        """The running server, started (again) if there is none."""
        async with self._server_lock:
            if self._server is None or self._server.closed:
                self._server = None
                if self._ending:
                    raise SandboxError("the sandbox is closed")
                binary = self._server_binary
                assert binary is not None
                fd = _SECCOMP_FD if seccomp.filter_file() is not None else None
                workspace, tmp = (
                    self._staged.get(str(p), str(p)) for p in (self.workspace, self.root / "tmp")
                )
                binds = [(self._staged.get(h, h), inside, writable) for h, inside, writable in self.binds]
                binds.append((self._staged.get(binary, binary), commandserver.INSIDE, False))
                inner = bwrap_argv(
                    self.cfg, workspace, tmp, [commandserver.INSIDE], {}, None, binds, fd, init=False
                )
                self._server = await commandserver.CommandServer.start(
                    self._launcher_prefix() + inner,
                    {"PATH": SYSTEM_PATH},
                    self._running,
                    commandserver.start_slots(self.cfg.max_starting),
                )
            return self._server

    def _stop_idle(self) -> None:
        self._idle = None
        if self._server is not None and not self._server.busy:
            stopping, self._server = self._server, None
            self._stopping = asyncio.ensure_future(stopping.close())

    async def close(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self._ending = True  # no new server from here on
        if self._server is not None:
            stopping, self._server = self._server, None
            await stopping.close()
        await super().close()

    def _remove(self) -> None:
        try:
            if self._owner is not None and self._given_workspace is not None:
                try:
                    _restore_owners(self._given_workspace, self._owners)
                except OSError as exc:  # the caller's directory, gone or changed under us: not the sandbox's
                    log.warning("cannot give %s its owners back: %s", self._given_workspace, exc)
            for point in self._staged.values():  # a mount point only in launchers' namespaces
                with contextlib.suppress(OSError):
                    if os.path.isdir(point):
                        os.rmdir(point)
                    else:
                        os.unlink(point)
        finally:
            super()._remove()


def _reachable(path: str) -> bool:
    """Whether a uid of its own (no group of the path's) may search every directory above ``path``."""
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in Path(path).parents)


@functools.cache
def _stage_root() -> Path:
    """Where paths a sandbox's uid cannot reach are bound for it (once per process; removed at its exit)."""
    root = Path(tempfile.mkdtemp(prefix=f"gyre-stage-{os.getpid()}-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    root.chmod(0o711)
    return root


def _owners(top: Path) -> dict[tuple[int, int], tuple[int, int]]:
    """(device, inode) -> (uid, gid) of every entry of a tree, ``top`` included."""
    st = os.lstat(top)
    out = {(st.st_dev, st.st_ino): (st.st_uid, st.st_gid)}
    for entry in filetree.walk(top):
        out[entry.stat.st_dev, entry.stat.st_ino] = entry.stat.st_uid, entry.stat.st_gid
    return out


def _chown_tree(top: Path, uid: int) -> None:
    """Give a tree to ``uid`` (as its gid too), except files with other hard links: those may also lie outside
    the tree, where the sandbox must not gain the right to write them."""
    os.chown(top, uid, uid)
    for entry in filetree.walk(top):
        if stat.S_ISDIR(entry.stat.st_mode) or entry.stat.st_nlink == 1:
            with contextlib.suppress(FileNotFoundError):
                os.chown(entry.name, uid, uid, dir_fd=entry.dir_fd, follow_symlinks=False)


def _restore_owners(top: Path, owners: dict[tuple[int, int], tuple[int, int]]) -> None:
    """Give each entry of a given workspace its owner from before the sandbox (new entries: the workspace's)."""
    st = os.lstat(top)
    default = owners.get((st.st_dev, st.st_ino), (st.st_uid, st.st_gid))
    os.chown(top, *default)
    for entry in filetree.walk(top):
        uid, gid = owners.get((entry.stat.st_dev, entry.stat.st_ino), default)
        if (entry.stat.st_uid, entry.stat.st_gid) != (uid, gid):
            with contextlib.suppress(FileNotFoundError):
                os.chown(entry.name, uid, gid, dir_fd=entry.dir_fd, follow_symlinks=False)


@functools.cache
def _warn_no_seccomp() -> None:
    log.warning(
        "no seccomp filter for this architecture: sandboxed commands may create setuid files and devices in "
        "the workspace and use the kernel keyrings"
    )

"""What every backend shares: the host directories, file access, snapshots, and the life of each command.

A sandbox owns one private directory on the host (mode 0700) holding ``workspace/`` (unless the caller brought its
own), ``tmp/`` (the sandbox's /tmp, kept between commands) and ``snapshots/``. Closing removes that directory and
never the caller's workspace. A backend supplies only how a command is launched (`HostSandbox._launch`).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import itertools
import os
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from gyre.config import SandboxConfig
from gyre.errors import SandboxError, WorkspaceLimitExceeded
from gyre.sandbox import filetree, limits, paths, pyenv
from gyre.sandbox.cgroups import SandboxCgroup, support
from gyre.sandbox.interface import ExecResult, Sandbox, Snapshot
from gyre.sandbox.process import LAUNCHER_EXIT_S, RawExit, Running, exit_status, run_process

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The caller's extra environment, validated (names and values are text without NUL; names without '=')."""
    out = {}
    for key, value in (env or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise SandboxError(f"environment entries must be str: {key!r}={value!r}")
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise SandboxError(f"invalid environment variable {key!r}")
        out[key] = value
    return out


class HostSandbox(Sandbox):
    """A sandbox whose workspace is a host directory and whose commands are host processes (see the module)."""

    _kill_children_first: ClassVar[bool] = False  # see gyre.sandbox.process.kill_tree

    def __init__(
        self,
        cfg: SandboxConfig,
        workspace: Path | None = None,
        binds: Sequence[tuple[str, str, bool]] = (),
        python_env: Path | None = None,
        variables: Mapping[str, str] | None = None,
    ) -> None:
        """A sandbox of ``cfg``; ``workspace`` binds an existing directory (kept at close) instead of a new one.

        ``binds`` are extra host paths shown to commands: (host path, path inside, writable). ``python_env``: a
        prepared environment (`gyre.sandbox.pyenv`) commands run over, with a writable layer of their own.
        ``variables``: environment every command gets unless its caller passes its own (``{workspace}`` in a value
        is where commands see the workspace).
        """
        self.cfg = cfg
        self.binds = list(binds)
        self.python_env = python_env
        self._variables = check_env(variables)
        self._python_vars: dict[str, str] = {}
        if python_env is not None:  # read-only at its own path (its scripts name it), with its base Python
            self.binds += [(p, p, False) for p in sorted({str(python_env), pyenv.base_prefix(python_env)})]
        self._id = uuid.uuid4().hex[:12]
        self._given_workspace = Path(workspace) if workspace is not None else None
        self._root: Path | None = None
        self._workspace: Path | None = None
        self._cgroup: SandboxCgroup | None = None
        self._owner: int | None = None  # uid (= gid) owning the sandbox's files, in uid containment
        self._running = Running()
        self._snapshots = itertools.count()
        self._closed = False
        self.containment: limits.Containment = limits.choose_containment(cfg, self.isolated)

    @property
    def id(self) -> str:
        return self._id

    @property
    def workspace(self) -> Path:
        if self._workspace is None:
            raise SandboxError("the sandbox is not open: use it in `async with`")
        return self._workspace

    @property
    def root(self) -> Path:
        """The sandbox's private host directory."""
        if self._root is None:
            raise SandboxError("the sandbox is not open: use it in `async with`")
        return self._root

    # -- life cycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._root is not None or self._closed:
            raise SandboxError("a sandbox is started once")
        creating = asyncio.get_running_loop().run_in_executor(None, self._create)
        try:
            await asyncio.shield(creating)
        except BaseException:
            await asyncio.wait([creating])  # a thread cannot be stopped: let it finish, then undo its work
            await self.close()
            raise

    def _create(self) -> None:
        if self._given_workspace is not None:
            self._given_workspace = self._given_workspace.resolve()  # bwrap needs absolute paths
            if not self._given_workspace.is_dir():
                raise SandboxError(f"workspace {self._given_workspace} is not a directory")
        base = Path(self.cfg.workspace_root or tempfile.gettempdir()).resolve()
        try:
            base.mkdir(parents=True, exist_ok=True)
            self._root = Path(tempfile.mkdtemp(prefix=f"gyre-sandbox-{self._id}-", dir=base))
            for sub in ("tmp", "snapshots"):
                (self._root / sub).mkdir()
            (self._root / "tmp").chmod(0o1777)
            if self._given_workspace is None:
                (self._root / "workspace").mkdir()
            self._workspace = self._given_workspace or self._root / "workspace"
            # the layer, before _prepare: it is the sandbox's own, like the rest of its /tmp
            if self.python_env is not None:
                shown = f"{self._shown_tmp()}/{pyenv.LAYER_NAME}"
                pyenv.make_layer(self.python_env, self._root / "tmp" / pyenv.LAYER_NAME, shown)
                self._python_vars = pyenv.layer_environment(self.python_env, shown, SYSTEM_PATH)
        except OSError as exc:
            raise SandboxError(f"cannot create a sandbox under {base}: {exc}") from None
        if self.containment == "cgroup":
            cg = support()
            self._cgroup = SandboxCgroup(
                f"gyre-{os.getpid()}-{self._id}", self.cfg.max_processes, self.cfg.memory_mib * limits.MIB, cg
            )
        self._prepare()

    def _prepare(self) -> None:
        """Backend set-up once the directories exist (blocking; runs in a thread)."""

    def command_env(self) -> dict[str, str]:
        """The variables a command gets before its caller's own (its Python layer's, then ``variables``)."""
        return {**self._python_vars, **self._shown(self._variables)}

    def _shown(self, variables: dict[str, str]) -> dict[str, str]:
        return {k: v.replace("{workspace}", self.WORKSPACE) for k, v in variables.items()}

    def _shown_tmp(self) -> str:
        """Where commands see the sandbox's /tmp directory."""
        return str(self.root / "tmp")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._running.kill_all(self._kill_children_first)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LAUNCHER_EXIT_S):
                    await self._running.wait_empty()  # the commands' own tasks reap them
            self._running.kill_all()
            if self._cgroup is not None:
                # kernel pseudo-files, but the write waits on the kernel's cgroup lock (measured up to 0.3 s
                # with thousands of sandboxes starting): never on the loop
                await asyncio.to_thread(self._cgroup.kill)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await self._running.wait_empty()
        finally:
            removing = asyncio.get_running_loop().run_in_executor(None, self._remove)
            try:
                await asyncio.shield(removing)
            except asyncio.CancelledError:
                await asyncio.wait([removing])  # cancelled: still finish, never leave anything behind
                raise

    def _remove(self) -> None:
        try:
            if self._cgroup is not None:
                self._cgroup.remove()
                self._cgroup = None
        finally:
            if self._root is not None:
                filetree.remove(self._root)
                self._root = None
            self._workspace = None

    # -- commands ------------------------------------------------------------------------------------------

    @abc.abstractmethod
    def _launch(
        self, argv: list[str], env: dict[str, str], cwd: str | None
    ) -> tuple[list[str], dict[str, str], str]:
        """(argv, environment, host cwd) that run ``argv`` in this sandbox (each backend's own)."""

    def _launcher_prefix(self) -> list[str]:
        """The cgroup join and the rlimits every backend puts before its command."""
        files = self._cgroup.procs_files if self._cgroup is not None else []
        memory_in_cgroup = self._cgroup is not None and self._cgroup.memory_limited
        return limits.join_argv(files) + limits.prlimit_argv(self.cfg, self.containment, memory_in_cgroup)

    async def _run(
        self, argv: list[str], env: dict[str, str], cwd: str | None, stdin: bytes | None, timeout_s: float
    ) -> RawExit:
        """Run one command of this sandbox: by default a new launcher per command (`_launch`)."""
        full, full_env, host_cwd = self._launch(argv, env, cwd)
        return await run_process(
            full,
            env=full_env,
            cwd=host_cwd,
            stdin=stdin,
            timeout_s=timeout_s,
            output_limit_bytes=self.cfg.output_limit_bytes,
            running=self._running,
            children_first=self._kill_children_first,
        )

    async def exec(
        self,
        cmd: str | list[str],
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | bytes | None = None,
    ) -> ExecResult:
        if self._closed or self._root is None:
            raise SandboxError("the sandbox is closed" if self._closed else "the sandbox is not open")
        if isinstance(cmd, str):
            argv = [limits.tool("bash"), "-c", cmd]
        elif isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd):
            argv = list(cmd)
        else:
            raise SandboxError(f"a command is a str or a non-empty list of str, not {cmd!r}")
        if any("\0" in a for a in argv):
            raise SandboxError("a command cannot contain NUL characters")
        if timeout_s is not None and timeout_s <= 0:
            raise SandboxError(f"timeout_s must be positive, not {timeout_s}")
        full_env = check_env({**self._python_vars, **self._shown(self._variables), **(env or {})})
        before = self._cgroup.counters() if self._cgroup is not None else (0, 0)
        try:
            raw = await self._run(
                argv,
                full_env,
                cwd,
                stdin.encode() if isinstance(stdin, str) else stdin,
                timeout_s or self.cfg.default_timeout_s,
            )
        except (FileNotFoundError, NotADirectoryError) as exc:  # a host cwd that is not there (local)
            return ExecResult(
                exit_code=1, stdout="", stderr=f"gyre: cannot change directory to {cwd}: {exc}\n"
            )
        except OSError as exc:
            raise SandboxError(f"cannot start a command in sandbox {self._id}: {exc}") from None
        after = self._cgroup.counters() if self._cgroup is not None else (0, 0)
        code, signame = exit_status(raw.returncode)
        if raw.timed_out:
            signame = "SIGKILL"
        stderr = raw.stderr.text()
        if code == limits.JOIN_FAILED_EXIT and stderr.startswith("gyre: cannot join the sandbox cgroup"):
            raise SandboxError("a command could not join its sandbox's cgroup (was the sandbox closed?)")
        return ExecResult(
            exit_code=code,
            stdout=raw.stdout.text(),
            stderr=stderr,
            timed_out=raw.timed_out,
            truncated=raw.stdout.truncated or raw.stderr.truncated,
            duration_s=raw.duration_s,
            killed_by=signame,
            resource_exceeded=limits.classify(
                code, signame, stderr, after[0] - before[0], after[1] - before[1]
            ),
        )

    # -- files and snapshots -------------------------------------------------------------------------------

    async def read_file(self, path: str) -> bytes:
        return await asyncio.to_thread(paths.read_file, self.workspace, path, self.WORKSPACE)

    async def write_file(self, path: str, data: bytes | str) -> None:
        blob = data.encode() if isinstance(data, str) else bytes(data)
        await asyncio.to_thread(paths.write_file, self.workspace, path, self.WORKSPACE, blob, self._owner)

    async def snapshot(self) -> Snapshot:
        snap = Snapshot(self._id, f"{next(self._snapshots):06d}")
        dest = self.root / "snapshots" / snap.name
        await copy_tree(self.workspace, dest)
        return snap

    async def restore(self, snapshot: Snapshot) -> None:
        src = self.root / "snapshots" / snapshot.name
        if snapshot.sandbox_id != self._id or not await asyncio.to_thread(src.is_dir):
            raise SandboxError(f"snapshot {snapshot.name} was not taken in sandbox {self._id}")
        await asyncio.to_thread(filetree.empty, self.workspace)
        await copy_tree(src, self.workspace)


def workspace_limits(cfg: SandboxConfig) -> filetree.Limits:
    """The quotas of one workspace, and of one copy of it out of its sandbox (`gyre.sandbox.filetree`)."""
    return filetree.Limits(
        max_bytes=cfg.disk_quota_mib * limits.MIB, max_entries=cfg.max_inodes, timeout_s=cfg.copy_timeout_s
    )


def make_scratch(workspace_root: str, prefix: str) -> Path:
    """A new private directory under ``workspace_root`` (empty: the system temp dir) that sandboxes running as
    their own uid can traverse (mode 0711): where a workspace that outlives one sandbox is kept (blocking)."""
    base = Path(workspace_root or tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    scratch.chmod(0o711)
    return scratch


async def copy_tree(src: Path, dest: Path, bounds: filetree.Limits | None = None) -> None:
    """Copy the directory ``src`` onto ``dest`` (modes, owners, times, links) with ``cp -a``, then strip set-id
    bits and device files from the copy (`filetree.sanitize`): nothing privileged leaves a sandbox this way.

    ``bounds`` (`workspace_limits`): a source past its bytes or entries is refused before anything is copied, and
    a copy that takes longer than its time is killed; both raise `WorkspaceLimitExceeded` (``dest`` may hold a
    partial copy: the caller removes it).
    """
    if bounds is not None:
        await asyncio.to_thread(filetree.usage, src, bounds)  # stops as soon as it is over: bounded too
    argv = [limits.tool("cp"), "-a", "-T", "--reflink=auto", "--", str(src), str(dest)]
    timeout_s = None if bounds is None else bounds.timeout_s
    done = await run_process(
        argv, env={"PATH": SYSTEM_PATH}, cwd=None, stdin=None, timeout_s=timeout_s, output_limit_bytes=1 << 16
    )
    if done.timed_out:
        raise WorkspaceLimitExceeded("time", timeout_s or 0, 0)
    if done.returncode != 0:
        # cp works by path, and a tree deeper than PATH_MAX (the agent's doing) defeats it; the walk by directory
        # descriptors does not (it keeps links, regular files and directories: what grading reads)
        failed = done.stderr.text().strip()[-500:]
        await asyncio.to_thread(filetree.remove, dest)
        try:
            await asyncio.to_thread(filetree.copy, src, dest, bounds)
        except OSError as exc:
            raise SandboxError(
                f"cannot copy the workspace {src} to {dest}: {failed}; by descriptors: {exc}"
            ) from None
    await asyncio.to_thread(filetree.sanitize, dest)

"""The sandbox protocol: what an agent's commands run in, whatever the backend.

A sandbox is an async context manager. Entering creates its workspace (a host directory, seen inside the sandbox at
``WORKSPACE``) and its isolation; leaving kills every process it started and removes every directory it created.
Inside, an agent runs commands (``exec``), reads and writes workspace files, and takes or restores snapshots of the
workspace. A command that fails, times out or exceeds a limit is data on its `ExecResult`, never an exception;
`SandboxError` means the sandbox itself could not be created, used or cleaned up, or a path left the workspace.
"""

from __future__ import annotations

import abc
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

import msgspec

WORKSPACE = "/workspace"  # where an isolated sandbox sees its workspace

# Values of ExecResult.resource_exceeded.
RESOURCES = ("memory", "processes", "cpu_time", "file_size", "open_files")


class ExecResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one command did: its exit status, its (capped) output and which limits stopped it."""

    exit_code: int  # 0-255; a command ended by signal N reports 128+N, as shells do
    stdout: str  # decoded as UTF-8 with replacement characters; a marker line ends a truncated stream
    stderr: str
    timed_out: bool = False  # the wall-clock timeout killed the command's whole process tree
    truncated: bool = False  # stdout or stderr passed the output limit and was cut
    duration_s: float = 0.0  # wall clock from start to exit
    killed_by: str | None = None  # name of the signal that ended the command ("SIGKILL"), if one did
    resource_exceeded: str | None = None  # one of RESOURCES when a limit was hit and we could tell which

    @property
    def ok(self) -> bool:
        """The command exited 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out


class Snapshot(msgspec.Struct, frozen=True):
    """A saved copy of one sandbox's workspace; valid only in that sandbox and until it closes."""

    sandbox_id: str
    name: str


class Sandbox(abc.ABC):
    """An isolated place to run one execution's commands. Use it as ``async with make_sandbox(cfg) as sb``.

    Paths given to ``read_file``/``write_file`` are relative to the workspace or absolute under ``WORKSPACE``;
    one that resolves outside the workspace (``..``, another absolute path, a symlink pointing out) raises
    `SandboxError`. Commands may run concurrently in one sandbox; limits on processes and memory are shared by
    them. Snapshot and restore while no command runs, or the copy is of a workspace in motion.
    """

    isolated: ClassVar[bool]  # False for a backend that runs commands on the host as they are
    WORKSPACE: str  # the workspace's path as commands see it

    @property
    @abc.abstractmethod
    def id(self) -> str:
        """A name unique among this host's sandboxes."""

    @property
    @abc.abstractmethod
    def workspace(self) -> Path:
        """The workspace's path on the host (valid while the sandbox is open)."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Create the workspace and the isolation; `__aenter__` calls it."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Kill every process of the sandbox and remove its directories; idempotent; `__aexit__` calls it."""

    @abc.abstractmethod
    async def exec(
        self,
        cmd: str | list[str],
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | bytes | None = None,
    ) -> ExecResult:
        """Run a command (a string runs through ``bash -c``; a list is the argv) and wait for it.

        ``timeout_s`` defaults to the config's ``default_timeout_s``; ``env`` adds to the scrubbed environment;
        ``cwd`` is relative to the workspace or absolute; ``stdin`` is fed to the command, else it reads nothing.
        """

    def command_env(self) -> dict[str, str]:
        """The variables a command gets before its caller's own (none beyond the scrubbed environment here)."""
        return {}

    @abc.abstractmethod
    async def read_file(self, path: str) -> bytes:
        """The contents of a regular file in the workspace."""

    @abc.abstractmethod
    async def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace a file in the workspace (parent directories are created); str is written as UTF-8."""

    @abc.abstractmethod
    async def snapshot(self) -> Snapshot:
        """Save the workspace as it is now."""

    @abc.abstractmethod
    async def restore(self, snapshot: Snapshot) -> None:
        """Make the workspace exactly the snapshot again: files created since are deleted, changed ones reverted."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

"""The local backend: commands run as plain host processes in a temporary workspace. It isolates NOTHING.

A command here sees the whole host as the driver does: every file the driver's user may read or write, the network,
every process. Use it only to develop on a machine without bubblewrap, and only with code you trust. It keeps the
rest of the contract: the same API, a private temp workspace (``WORKSPACE`` is its host path), a scrubbed
environment, the rlimits and, where a cgroup is writable, the process and memory limits of `gyre.sandbox.limits`.
The wall timeout kills the command's process group; a process that leaves it (``setsid``) is only killed at close
when the sandbox has a cgroup.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import ClassVar

from gyre.sandbox.workspace import SYSTEM_PATH, HostSandbox

log = logging.getLogger(__name__)


@functools.cache
def _warn_once() -> None:
    log.warning(
        "sandbox.backend = 'local': commands run on the host WITHOUT isolation (files, network, processes); "
        "use it for development only"
    )


class LocalSandbox(HostSandbox):
    """A sandbox that isolates nothing (see the module); ``isolated`` is False."""

    isolated: ClassVar[bool] = False

    def _prepare(self) -> None:
        _warn_once()
        self.WORKSPACE = str(self.workspace)

    def _launch(
        self, argv: list[str], env: dict[str, str], cwd: str | None
    ) -> tuple[list[str], dict[str, str], str]:
        full_env = {
            "PATH": SYSTEM_PATH,
            "HOME": str(self.workspace),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "TMPDIR": str(self.root / "tmp"),
            **env,
        }
        workdir = os.path.normpath(os.path.join(self.workspace, cwd)) if cwd else str(self.workspace)
        return self._launcher_prefix() + argv, full_env, workdir

"""Sandboxes: where agents run commands. The default backend is bubblewrap; ``local`` isolates nothing; a config
with an ``image`` (a task's own, or ``sandbox.image``) runs each command in a container of it (`ContainerSandbox`).

    async with make_sandbox(cfg.sandbox) as sb:
        result = await sb.exec("pytest -q", timeout_s=300)

`check_backend` refuses, with instructions, a bubblewrap backend this host cannot run; `make_sandbox` calls it.
"""

from __future__ import annotations

import functools
import os
import random
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from gyre.config import SandboxConfig
from gyre.errors import SandboxError
from gyre.sandbox import commandserver, limits
from gyre.sandbox.bwrap import BwrapSandbox, bwrap_argv
from gyre.sandbox.container import ContainerSandbox, check_container
from gyre.sandbox.interface import WORKSPACE, ExecResult, Sandbox, Snapshot
from gyre.sandbox.local import LocalSandbox
from gyre.sandbox.workspace import SYSTEM_PATH

__all__ = [
    "WORKSPACE",
    "BwrapSandbox",
    "ContainerSandbox",
    "ExecResult",
    "LocalSandbox",
    "Sandbox",
    "SandboxConfig",
    "Snapshot",
    "check_backend",
    "make_sandbox",
]

_HOW_TO_FIX = (
    "install bubblewrap (`apt-get install bubblewrap`, or run scripts/setup.sh as root), or set "
    'sandbox.backend = "local" explicitly to run commands on this host without any isolation'
)


def check_backend(cfg: SandboxConfig) -> str:
    """Check that sandboxes of ``cfg`` can run here, and say how their limits are enforced.

    For bubblewrap this runs one real, empty sandbox once per process: bwrap must exist and be able to create its
    namespaces. With an image, a container of it must run (`check_container`, once per image). Raises SandboxError
    saying what to do otherwise.
    """
    if cfg.image:
        return check_container(cfg)
    limits.tool("prlimit")
    limits.tool("bash")
    mode = limits.choose_containment(cfg, cfg.backend == "bubblewrap")
    if mode == "uid":
        limits.tool("setpriv")
    how = limits.describe(mode, cfg)
    if cfg.backend == "local":
        return f"local (NOT isolated); {how}"
    _probe_bwrap(cfg.network)
    # the command server is built here, once, not on a busy loop
    commands = (
        "a command server per sandbox"
        if cfg.command_server and commandserver.binary()
        else "a bubblewrap per command"
    )
    return f"bubblewrap (isolated, {'HOST network' if cfg.network else 'no network'}; {commands}); {how}"


@functools.cache
def _probe_bwrap(network: bool) -> None:
    try:
        limits.tool("bwrap")
    except SandboxError:
        raise SandboxError(
            f"the bubblewrap sandbox backend needs bwrap, which is missing: {_HOW_TO_FIX}"
        ) from None
    with tempfile.TemporaryDirectory(prefix="gyre-sandbox-check-") as tmp:
        argv = bwrap_argv(SandboxConfig(network=network), tmp, tmp, ["true"], {}, None)
        if limits.own_uid(True):  # as sandboxes run: as an unprivileged uid, which needs user namespaces
            os.chmod(tmp, 0o755)
            argv = limits.setpriv_argv(random.randrange(100_000_000, 2_000_000_000)) + argv
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={"PATH": SYSTEM_PATH})
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxError(f"bwrap cannot run here ({exc}): {_HOW_TO_FIX}") from None
    if out.returncode != 0:
        reason = out.stderr.strip() or f"exit code {out.returncode}"
        raise SandboxError(f"bwrap cannot create its namespaces here ({reason}): {_HOW_TO_FIX}")


def make_sandbox(
    cfg: SandboxConfig,
    workspace: Path | None = None,
    binds: Sequence[tuple[str, str, bool]] = (),
    python_env: Path | None = None,
    variables: Mapping[str, str] | None = None,
) -> Sandbox:
    """A sandbox of ``cfg``'s backend (not yet started: use it in ``async with``).

    ``workspace`` binds an existing directory as the workspace instead of a new empty one; it is kept at close.
    ``binds`` shows extra host paths to commands, (host path, path inside, writable): the bubblewrap backend
    mounts them; the local backend runs on the host, where they are already visible at their host paths.
    ``python_env``: a prepared Python environment commands run over, read-only, with a writable layer of the
    sandbox's own (`gyre.sandbox.pyenv`). ``variables``: environment every command gets unless its caller passes
    its own; ``{workspace}`` in a value is where commands see the workspace.
    Checks the backend (`check_backend`); the first check of a process blocks for tens of milliseconds, so a
    driver makes it at start-up, before its event loop is busy.
    """
    check_backend(cfg)
    if cfg.image:  # the task's own toolchain: a container of its image per command
        return ContainerSandbox(cfg, workspace=workspace, binds=binds)
    cls = BwrapSandbox if cfg.backend == "bubblewrap" else LocalSandbox
    return cls(cfg, workspace=workspace, binds=binds, python_env=python_env, variables=variables)

"""Container sandboxes: each command runs in a fresh container of a task's image, by podman or Docker.

For tasks that bring their own toolchain as a container image (Harbor's ``[environment] docker_image``). The image
must already be in the local runtime's store (``podman pull``, ``docker load``...): Gyre never pulls (``--pull
never``), so nothing reaches a registry while tasks run. The workspace and ``/tmp`` are host directories, as in
every `HostSandbox`, so snapshots, quotas, the runtime's copies and the verifier work as they do elsewhere.

What a command sees, like a bubblewrap sandbox's over the host's system:

- the image's filesystem read-only (``--read-only``), the workspace read-write at ``/workspace`` (its cwd and
  ``HOME``), the sandbox's own ``/tmp`` (kept between commands), a ``/dev/shm`` as large as its memory, and the
  binds, read-only unless marked writable;
- no network (``--network none``; ``network = true`` shares the host's), no capabilities, no_new_privs, hostname
  ``gyre``, a small init as pid 1 (``--init``) with the command as its child;
- never host root: as root, podman maps the container's users onto a range of unprivileged host uids of the
  sandbox's own (``--uidmap``), whose root owns the workspace and ``/tmp`` while the sandbox is open (a given
  workspace gets its owners back at close); Docker, which cannot map per container, runs the command as that uid
  (``--user``); rootless podman's container root is the invoking user;
- the image's environment (its ``PATH`` and the rest) with ``HOME``, ``TMPDIR``, ``TERM`` and what the caller
  passes; nothing of the driver's.

Limits: memory (``--memory``, no swap), processes (``--pids-limit``) and ``container_cpus`` (``--cpus``) bound each
command's container; CPU time, file size, open files and core dumps are rlimits (``--ulimit``) as elsewhere; as
root each sandbox's uid also bounds its processes together (``RLIMIT_NPROC``). A command's container ends with the
command, daemons included: its timeout, a cancellation or the sandbox's closing removes it (``rm -f``), and podman
kills it by itself a little after its timeout (``--timeout``) should the driver die. A command the memory limit
killed reports SIGKILL; the runtime does not say reliably that it was the memory, so ``resource_exceeded`` stays
unset. Starting a command's container costs about 0.45 s (podman with runc on the 2-core dev VM).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import itertools
import json
import logging
import math
import os
import posixpath
import random
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar, Literal

import msgspec

from gyre.config import SandboxConfig
from gyre.errors import SandboxError
from gyre.sandbox import limits
from gyre.sandbox.bwrap import _chown_tree, _owners, _restore_owners
from gyre.sandbox.interface import WORKSPACE, ExecResult
from gyre.sandbox.workspace import SYSTEM_PATH, HostSandbox

log = logging.getLogger(__name__)

RuntimeName = Literal["podman", "docker"]
LABEL = "gyre.sandbox"  # every container of a sandbox carries its id under this label
UID_RANGE = 65536  # host uids mapped per podman sandbox (the container's 0-65535)
BACKSTOP_S = 30  # podman kills a command's container this long after its timeout, should the driver be gone
_CLI_TIMEOUT_S = 120.0  # one call of the runtime's CLI (a probe, an inspect, a removal)
# what the runtime's CLI needs of the driver's environment to find its storage, daemon and configuration
_CLIENT_ENV = (
    "HOME", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "CONTAINER_HOST", "CONTAINERS_CONF",
    "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT",
    "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY",
)  # fmt: skip
_SANDBOX_ENV = {"HOME": WORKSPACE, "TMPDIR": "/tmp", "TERM": "dumb"}
_IMAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")  # a reference, never an option of the CLI
_CALL: contextvars.ContextVar[tuple[str, float]] = contextvars.ContextVar("gyre_container_call")


@dataclasses.dataclass(frozen=True, slots=True)
class Runtime:
    """A container runtime's CLI that works on this host."""

    name: RuntimeName
    path: str
    options: tuple[
        str, ...
    ] = ()  # global options: podman's ``--runtime runc`` where its default cannot run here

    def cli(self, *args: str) -> list[str]:
        """The argv of one call of the CLI."""
        return [self.path, *self.options, *args]


@dataclasses.dataclass(frozen=True, slots=True)
class Identity:
    """Whose the container's processes are on the host."""

    owner: int | None  # host uid (= gid) owning the workspace and /tmp while the sandbox is open; None: ours
    uidmap: bool = False  # podman: the container's uids 0-65535 are owner..owner+65535 on the host
    user: str | None = None  # docker: --user


def identity(runtime: RuntimeName) -> Identity:
    """A new sandbox's identity (see the module): a random range of unprivileged host uids under a root driver."""
    if os.geteuid() == 0:
        base = random.randrange(100_000_000 // UID_RANGE, 2_000_000_000 // UID_RANGE) * UID_RANGE
        if runtime == "podman":
            return Identity(base, uidmap=True)
        return Identity(base, user=f"{base}:{base}")
    if runtime == "docker":  # the daemon is root: run as our own uid, which owns the workspace already
        return Identity(None, user=f"{os.geteuid()}:{os.getegid()}")
    return Identity(None)  # rootless podman: the container's root is us


def container_argv(
    runtime: Runtime,
    cfg: SandboxConfig,
    who: Identity,
    name: str,
    label: str,
    workspace: str,
    tmp: str,
    argv: Sequence[str],
    env: dict[str, str],
    cwd: str | None,
    timeout_s: float,
    binds: Sequence[tuple[str, str, bool]] = (),
) -> list[str]:
    """The CLI's command line running ``argv`` in a new container of ``cfg.image`` over the host directories
    ``workspace`` and ``tmp`` (see the module for what it sees). ``binds``: (host path, path inside, writable)."""
    check_image_name(cfg.image)
    mib = cfg.memory_mib
    out = runtime.cli(
        "run", "--rm", "-i", "--pull=never", "--init", "--name", name, "--label", f"{LABEL}={label}"
    )
    out += ["--hostname", "gyre", "--network", "host" if cfg.network else "none", "--log-driver", "none"]
    out += ["--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    out += [f"--memory={mib}m", f"--memory-swap={mib}m", f"--shm-size={mib}m"]  # no swap; /dev/shm counts too
    out.append(f"--pids-limit={cfg.max_processes}")
    if cfg.container_cpus > 0:
        out.append(f"--cpus={cfg.container_cpus:g}")
    rlimits = {
        "cpu": f"{cfg.cpu_time_s}:{cfg.cpu_time_s + 5}",
        "fsize": str(cfg.file_size_mib * limits.MIB),
        "nofile": str(cfg.open_files),
        "core": "0",
    }
    if who.owner is not None:  # its own host uid: RLIMIT_NPROC counts this sandbox's processes only
        rlimits["nproc"] = str(cfg.max_processes)
    out += [f"--ulimit={key}={value}" for key, value in rlimits.items()]
    if runtime.name == "podman":
        out += ["--read-only-tmpfs=false", f"--timeout={math.ceil(timeout_s) + BACKSTOP_S}"]
    if who.uidmap and who.owner is not None:
        out += [f"--uidmap=0:{who.owner}:{UID_RANGE}", f"--gidmap=0:{who.owner}:{UID_RANGE}"]
    if who.user is not None:
        out += ["--user", who.user]
    for host, inside, writable in [(workspace, WORKSPACE, True), (tmp, "/tmp", True), *binds]:
        if ":" in host or ":" in inside or "," in host + inside:
            raise SandboxError(f"a container cannot bind a path with ':' or ',': {host} -> {inside}")
        out += ["--volume", f"{host}:{inside}:{'rw' if writable else 'ro'}"]
    for key, value in {**_SANDBOX_ENV, **env}.items():
        out += ["--env", f"{key}={value}"]
    workdir = WORKSPACE if cwd is None else posixpath.normpath(posixpath.join(WORKSPACE, cwd))
    # podman reads a JSON array as the entrypoint's argv; Docker takes the string as it is
    entrypoint = json.dumps([argv[0]]) if runtime.name == "podman" else argv[0]
    return [*out, "--workdir", workdir, "--entrypoint", entrypoint, cfg.image, *argv[1:]]


def check_image_name(image: str) -> None:
    """SandboxError unless ``image`` is a plausible image reference (nothing the CLI would read as an option)."""
    if not _IMAGE_NAME.fullmatch(image):
        raise SandboxError(f"{image!r} is not a container image name")


def client_env() -> dict[str, str]:
    """The environment the runtime's CLI runs with."""
    return {"PATH": SYSTEM_PATH, **{k: os.environ[k] for k in _CLIENT_ENV if k in os.environ}}


def _run_cli(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=_CLI_TIMEOUT_S, env=client_env(), check=False
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {_CLI_TIMEOUT_S:g} s")
    except OSError as exc:
        return subprocess.CompletedProcess(argv, 127, "", str(exc))


def _why(out: subprocess.CompletedProcess[str]) -> str:
    """The last lines of a failed call's error output."""
    lines = (out.stderr.strip() or out.stdout.strip() or f"exit code {out.returncode}").splitlines()
    return " / ".join(lines[-3:])[-600:]


@functools.cache
def _find(choice: str) -> Runtime | str:
    """The runtime ``choice`` names ("auto": podman, else Docker) if its CLI works here, else why none does."""
    problems = []
    for name in ("podman", "docker") if choice == "auto" else (choice,):
        path = shutil.which(name, path=SYSTEM_PATH)
        if path is None:
            problems.append(f"{name}: not installed")
            continue
        out = _run_cli([path, "info"])
        if out.returncode == 0:
            return Runtime("docker" if name == "docker" else "podman", path)
        problems.append(f"{name}: `{name} info` failed: {_why(out)}")
    return "; ".join(problems)


def find_runtime(choice: str) -> Runtime:
    """The container runtime of ``sandbox.container_runtime``; SandboxError saying what to do when none works."""
    found = _find(choice)
    if isinstance(found, str):
        raise SandboxError(
            f"no container runtime works here ({found}): install podman (`apt-get install podman`) or Docker "
            "to run tasks that name a container image"
        )
    return found


def _image_missing(runtime: Runtime, image: str) -> str | None:
    try:
        check_image_name(image)
    except SandboxError as exc:
        return f"which cannot be: {exc}"
    out = _run_cli(runtime.cli("image", "inspect", "--format", "{{.Id}}", image))
    if out.returncode == 0:
        return None
    return (
        f"which {runtime.name} does not have locally: pull or load it first (`{runtime.name} pull {image}`; "
        f"with Docker, `docker pull {image}`); Gyre never pulls images itself"
    )


def image_problem(image: str, choice: str = "auto") -> str | None:
    """Why a task naming ``image`` cannot run here (no working runtime, or the image is not local); None: it can.

    For task loaders: no container is started (`check_container` runs one)."""
    found = _find(choice)
    if isinstance(found, str):
        return f"and no container runtime (podman or Docker) works here ({found}): install one to run it"
    return _image_missing(found, image)


def _try(runtime: Runtime, cfg: SandboxConfig) -> str | None:
    """Run ``bash -c 'exit 0'`` in a container as sandboxes will; why it failed, or None."""
    with tempfile.TemporaryDirectory(prefix="gyre-container-check-") as tmp:
        os.chmod(tmp, 0o755)
        name = f"gyre-check-{os.getpid()}-{random.randrange(1 << 32):08x}"
        who = identity(runtime.name)
        argv = container_argv(
            runtime, cfg, who, name, "check", tmp, tmp, ["bash", "-c", "exit 0"], {}, None, 60
        )
        out = _run_cli(argv)
        if out.returncode == 0:
            return None
        _run_cli(runtime.cli("rm", "-f", name))  # a CLI that timed out leaves its container running
        return _why(out)


@functools.cache
def _probe(choice: str, image: str, network: bool) -> Runtime:
    runtime = find_runtime(choice)
    if missing := _image_missing(runtime, image):
        raise SandboxError(f"the container image {image!r} cannot be used: {missing}")
    probe_cfg = SandboxConfig(image=image, network=network)
    attempts = [runtime]
    if runtime.name == "podman" and shutil.which("runc", path=SYSTEM_PATH):
        # podman's default OCI runtime (crun) refuses hosts with cgroups v1 and an empty v2 hierarchy mounted
        attempts.append(dataclasses.replace(runtime, options=("--runtime", "runc")))
    errors = []
    for candidate in attempts:
        error = _try(candidate, probe_cfg)
        if error is None:
            if candidate.options:
                log.info("%s runs containers here with %s", runtime.name, " ".join(candidate.options))
            return candidate
        errors.append(f"{' '.join([candidate.name, *candidate.options])}: {error}")
    raise SandboxError(
        f"{runtime.name} cannot run a container of {image!r} here ({'; '.join(errors)}); the image needs bash, "
        f"and {runtime.name} must be able to run containers on this host (try `{runtime.name} run --rm {image} "
        "bash -c true`)"
    )


def check_container(cfg: SandboxConfig) -> str:
    """Check that containers of ``cfg.image`` run here (once per process and image: it starts one), and say how
    their limits are enforced. Raises SandboxError saying what to do otherwise."""
    runtime = _probe(cfg.container_runtime, cfg.image, cfg.network)
    cli = " ".join([runtime.name, *runtime.options])
    cpus = f"{cfg.container_cpus:g}" if cfg.container_cpus > 0 else "unbounded"
    who = "its own unprivileged host uids" if os.geteuid() == 0 else "the driver's uid"
    return (
        f"container ({cli}, image {cfg.image}; isolated, {'HOST network' if cfg.network else 'no network'}); "
        f"per command: memory {cfg.memory_mib} MiB, processes {cfg.max_processes}, cpus {cpus} (its cgroup); "
        f"cpu {cfg.cpu_time_s} s/process, file size {cfg.file_size_mib} MiB, open files {cfg.open_files} "
        f"(rlimits); runs as {who}"
    )


class ContainerSandbox(HostSandbox):
    """A sandbox whose commands run in containers of ``cfg.image`` (see the module)."""

    isolated: ClassVar[bool] = True
    WORKSPACE = WORKSPACE

    def __init__(
        self, cfg: SandboxConfig, workspace: Path | None = None, binds: Sequence[tuple[str, str, bool]] = ()
    ) -> None:
        if not cfg.image:
            raise SandboxError("a container sandbox needs an image (sandbox.image, or the task's)")
        # no cgroup or launcher of Gyre's: the container runtime's own cgroup bounds each command
        super().__init__(msgspec.structs.replace(cfg, containment="auto"), workspace, binds)
        self.cfg = cfg
        self.containment = "rlimit"
        self.runtime = _probe(cfg.container_runtime, cfg.image, cfg.network)
        self.identity = identity(self.runtime.name)
        self._calls = itertools.count()
        self._launched: set[str] = set()  # containers whose CLI was started and not yet seen removed
        self._owners: dict[tuple[int, int], tuple[int, int]] = {}  # a given workspace's, before: see _remove

    def _prepare(self) -> None:
        owner = self.identity.owner
        if owner is None:
            return
        if self._given_workspace is not None:
            self._owners = _owners(self.workspace)
        self._owner = owner  # from here on, closing gives a given workspace back
        for top in (self.workspace, self.root / "tmp"):
            _chown_tree(top, owner)

    def _shown_tmp(self) -> str:
        return "/tmp"

    async def exec(
        self,
        cmd: str | list[str],
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | bytes | None = None,
    ) -> ExecResult:
        if isinstance(cmd, str):
            cmd = ["bash", "-c", cmd]  # the image's bash, wherever its PATH has it
        name = f"gyre-{self.id}-{next(self._calls)}"
        token = _CALL.set((name, timeout_s or self.cfg.default_timeout_s))  # for _launch, called within
        finished = False
        try:
            result = await super().exec(cmd, timeout_s, env, cwd, stdin)
            finished = not result.timed_out
            return result
        finally:
            _CALL.reset(token)
            if name in self._launched:
                self._launched.discard(name)
                if not finished or self._closed:  # its CLI was killed: the container outlives it
                    await _to_the_end(functools.partial(self._remove_containers, [name]))

    def _launch(
        self, argv: list[str], env: dict[str, str], cwd: str | None
    ) -> tuple[list[str], dict[str, str], str]:
        name, timeout_s = _CALL.get()
        full = container_argv(
            self.runtime, self.cfg, self.identity, name, self.id, str(self.workspace), str(self.root / "tmp"),
            argv, env, cwd, timeout_s, self.binds,
        )  # fmt: skip
        self._launched.add(name)
        return full, client_env(), "/"

    async def close(self) -> None:
        try:
            if not self._closed and self._root is not None:
                await _to_the_end(self._remove_all)
        finally:
            await super().close()

    def _remove_all(self) -> None:
        """Remove every container of the sandbox, running or not (blocking)."""
        listed = _run_cli(self.runtime.cli("ps", "-a", "-q", "--filter", f"label={LABEL}={self.id}"))
        if listed.returncode != 0:
            raise SandboxError(f"cannot list the containers of sandbox {self.id}: {_why(listed)}")
        self._remove_containers(listed.stdout.split())

    def _remove_containers(self, names: list[str]) -> None:
        """Kill and remove containers; gone already is fine (blocking)."""
        if not names:
            return
        now = ["-t", "0"] if self.runtime.name == "podman" else []  # Docker's rm -f kills at once
        out = _run_cli(self.runtime.cli("rm", "-f", *now, *names))
        if out.returncode != 0 and "no such container" not in out.stderr.lower():
            raise SandboxError(f"cannot remove the containers {' '.join(names)}: {_why(out)}")

    def _remove(self) -> None:
        try:
            if self._owner is not None and self._given_workspace is not None:
                try:
                    _restore_owners(self._given_workspace, self._owners)
                except OSError as exc:  # the caller's directory, gone or changed under us: not the sandbox's
                    log.warning("cannot give %s its owners back: %s", self._given_workspace, exc)
        finally:
            super()._remove()


async def _to_the_end(fn: Callable[[], None]) -> None:
    """Run blocking ``fn`` in a thread; a cancellation still waits for it (clean-up must finish), then propagates."""
    running = asyncio.get_running_loop().run_in_executor(None, fn)
    try:
        await asyncio.shield(running)
    except asyncio.CancelledError:
        await asyncio.wait([running])
        raise

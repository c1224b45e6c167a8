"""Task environments: the Python packages a task's commands need, built once on the host and shared.

A task declares what its commands need (`EnvironmentSpec`: an NL2RepoBench spec's freeze list, a grader's test
dependencies, a Gyre task's ``[environment]`` table). Before its first execution (or ahead of time, with ``gyre
tasks prepare``) the host, where the package registries are reachable, builds a virtual environment from it with a
well-kept installer (uv, else pip):

1. the pins, exactly and without resolving (a freeze list is complete; that is how the benchmark's image was built);
   a pin this host cannot install (no wheel for its Python, a failed build) is left out and recorded;
2. the requirements, resolved on top, with pip, setuptools, wheel and pytest when nothing pins them (the agent's
   ``pip install -e .`` builds offline with what is here; the verifier runs pytest from here).

Environments are content-addressed (`environment_key`: the pins, the requirements and the host's Python), so tasks
that need the same thing share one directory, and preparing twice does no work: a build holds a file lock, and its
manifest (``gyre-env.json``), written last, marks it complete. Sandboxes see an environment read-only under a
writable layer of their own (`gyre.sandbox.pyenv`). A build that fails raises `EnvironmentFailed` with the
installer's reason; the task is then refused before anything runs, never scored 0.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from gyre.config import SandboxConfig
from gyre.errors import TaskError
from gyre.tasks.task import EnvironmentSpec, Task

SCHEMA = 2  # bump when what a build puts in an environment changes: every key changes with it
MANIFEST = "gyre-env.json"
BASE_TOOLS = ("pip", "setuptools", "wheel", "pytest")  # added, resolved, when the task pins none of them
# the modules of the environment's pytest11 entry points (what plugin autoload would load), one per line
_PLUGINS = (
    "import importlib.metadata as m\n"
    "print('\\n'.join(sorted({e.value.split(':')[0] for e in m.entry_points(group='pytest11')})))"
)
_TAIL = 1500  # characters of an installer's output kept in a failure's reason


class EnvironmentFailed(TaskError):
    """A task's environment could not be built; the message says why (the installer's own words)."""


class PreparedEnvironment(msgspec.Struct, frozen=True, kw_only=True):
    """A built environment: its manifest."""

    key: str
    path: str
    python: str  # the host Python it runs
    requested_python: str | None  # what the task named
    installer: str  # "uv 0.x" or "pip 2x"
    installed: list[str]  # name==version of every distribution in it
    skipped: list[str]  # pins left out, each with why
    pytest_plugins: list[
        str
    ] = []  # modules of its distributions' pytest11 entry points: the grader loads these
    build_s: float
    created_at: float


def environment_key(spec: EnvironmentSpec) -> str:
    """The content address of ``spec`` on this host: what is installed, and the Python that runs it."""
    data = {
        "schema": SCHEMA,
        "python": [sys.implementation.cache_tag, platform.machine(), sys.version_info[:2]],
        "pins": sorted({_normal(p) for p in spec.pins}),
        "requirements": sorted({_normal(r) for r in spec.requirements}),
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:32]


def cache_root(cfg: SandboxConfig) -> Path:
    """Where environments are built (see ``sandbox.env_cache_dir``)."""
    if cfg.env_cache_dir:
        return Path(cfg.env_cache_dir).expanduser().absolute()
    if os.environ.get("GYRE_ENV_CACHE"):
        return Path(os.environ["GYRE_ENV_CACHE"]).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "gyre" / "envs"


def check_spec(spec: EnvironmentSpec, where: str) -> None:
    """`TaskError` naming ``where`` when a pin or requirement is not a plain requirement string (an installer
    option such as ``--index-url`` is never passed through)."""
    for field, items in (("pins", spec.pins), ("requirements", spec.requirements)):
        for i, item in enumerate(items):
            try:
                if item.lstrip().startswith("-"):
                    raise InvalidRequirement("an installer option, not a requirement")
                Requirement(item)
            except InvalidRequirement as exc:
                raise TaskError(
                    f"{where}: field 'environment.{field}[{i}]': {item!r} is not a requirement: {exc}"
                ) from None


def lookup(spec: EnvironmentSpec, cfg: SandboxConfig) -> PreparedEnvironment | None:
    """The environment of ``spec`` when it is already built, else None (never builds)."""
    path = cache_root(cfg) / environment_key(spec)
    try:
        return msgspec.json.decode((path / MANIFEST).read_bytes(), type=PreparedEnvironment)
    except (OSError, msgspec.DecodeError):
        return None


def prepare(spec: EnvironmentSpec, cfg: SandboxConfig) -> tuple[PreparedEnvironment, bool]:
    """The environment of ``spec``, built unless it already is (blocking); (manifest, whether this call built it).
    Concurrent calls, in this process or others, wait for one build. `EnvironmentFailed` when it cannot be built."""
    root = cache_root(cfg)
    key = environment_key(spec)
    try:
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o755)  # sandboxes' uids read environments (through it, at their own paths)
        lock = open(root / f"{key}.lock", "a+")  # noqa: SIM115 - held for the whole build
    except OSError as exc:
        raise EnvironmentFailed(f"cannot use the environment cache {root}: {exc}") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = lookup(spec, cfg)
        if done is not None:
            return done, False
        path = root / key
        if path.exists():  # a build that died half-way
            shutil.rmtree(path)
        try:
            return _build(spec, path, key, cfg), True
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise


def _build(spec: EnvironmentSpec, path: Path, key: str, cfg: SandboxConfig) -> PreparedEnvironment:
    start = time.monotonic()
    deadline = start + cfg.env_build_timeout_s
    base = _base_python()
    _run([base, "-m", "venv", "--without-pip", str(path)], deadline, "creating the virtual environment")
    python = str(path / "bin" / "python")
    installer = _installer(cfg)
    skipped: list[str] = []
    if spec.pins:
        try:
            _install(installer, python, list(spec.pins), deadline, resolve=False)
        except EnvironmentFailed:  # find the pins that fail on their own; the rest go in
            for pin in spec.pins:
                try:
                    _install(installer, python, [pin], deadline, resolve=False)
                except EnvironmentFailed as exc:
                    skipped.append(f"{pin}: {_last_line(str(exc))}")
    pinned = {_name(p) for p in spec.pins}
    extra = [*spec.requirements, *(t for t in BASE_TOOLS if t not in pinned)]
    if extra:
        _install(installer, python, extra, deadline, resolve=True)
    installed = _freeze(installer, python, deadline)
    plugins = _run([python, "-I", "-c", _PLUGINS], deadline, "listing its pytest plugins").split()
    for tool in BASE_TOOLS:
        if not any(_name(line) == tool for line in installed):
            raise EnvironmentFailed(
                f"{tool} is not in the environment after installing (pins left out: {skipped})"
            )
    for directory, _, files in os.walk(path):  # every sandbox uid reads it; nobody but the host writes it
        os.chmod(directory, 0o755)
        for name in files:
            file = Path(directory, name)
            if not file.is_symlink():
                file.chmod(file.stat().st_mode & 0o755 | 0o444)
    manifest = PreparedEnvironment(
        key=key, path=str(path), python=platform.python_version(), requested_python=spec.python,
        installer=_version(installer), installed=installed,
        skipped=skipped, pytest_plugins=plugins, build_s=round(time.monotonic() - start, 2), created_at=time.time(),
    )  # fmt: skip
    (path / MANIFEST).write_bytes(msgspec.json.format(msgspec.json.encode(manifest)))
    return manifest


def _base_python() -> str:
    """The host's base interpreter (not the driver's virtual environment: an environment holds only its own)."""
    base = getattr(sys, "_base_executable", "") or sys.executable
    return str(Path(base).resolve())


def _installer(cfg: SandboxConfig) -> list[str]:
    """The installer's argv prefix up to ``pip``'s subcommand: ``uv pip`` or ``python -m pip``."""
    if cfg.env_installer in ("auto", "uv"):
        try:
            import uv

            return [uv.find_uv_bin(), "pip"]
        except (ImportError, FileNotFoundError):
            if cfg.env_installer == "uv":
                raise EnvironmentFailed("sandbox.env_installer = 'uv' but uv is not installed") from None
    return [sys.executable, "-m", "pip"]


def _version(installer: list[str]) -> str:
    if installer[0].endswith("uv"):
        out = subprocess.run([installer[0], "--version"], capture_output=True, text=True, check=False)
        return out.stdout.strip() or "uv"
    import pip

    return f"pip {pip.__version__}"


def _install(
    installer: list[str], python: str, items: Sequence[str], deadline: float, *, resolve: bool
) -> None:
    uv = installer[0].endswith("uv")
    argv = [*installer, "install", "--python", python] if uv else [*installer, "--python", python, "install"]
    argv += [] if resolve else ["--no-deps"]
    argv += ["--quiet"] if not uv else []
    _run([*argv, *items], deadline, f"installing {', '.join(items[:8])}{' ...' if len(items) > 8 else ''}")


def _freeze(installer: list[str], python: str, deadline: float) -> list[str]:
    uv = installer[0].endswith("uv")
    argv = (
        [*installer, "freeze", "--python", python]
        if uv
        else [*installer, "--python", python, "freeze", "--all"]
    )
    out = _run(argv, deadline, "listing what was installed")
    return sorted(line.strip() for line in out.splitlines() if line.strip() and not line.startswith("#"))


def _run(argv: list[str], deadline: float, what: str) -> str:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise EnvironmentFailed(f"{what}: the build ran out of sandbox.env_build_timeout_s")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=remaining, check=False)
    except subprocess.TimeoutExpired:
        raise EnvironmentFailed(f"{what}: the build ran out of sandbox.env_build_timeout_s") from None
    except OSError as exc:
        raise EnvironmentFailed(f"{what}: cannot run {argv[0]}: {exc}") from None
    if done.returncode != 0:
        whole = done.stderr.strip() or done.stdout.strip()
        missing = missing_packages(whole)
        named = f": the package registry has no {', '.join(missing)} as asked" if missing else ""
        # the reason on the first line, the installer's own words below it
        raise EnvironmentFailed(f"{what} failed (exit {done.returncode}){named}\n{whole[-_TAIL:]}")
    return done.stdout


# what pip and uv say when a requirement cannot be met, and the name they say it of
_MISSING = (
    re.compile(r"No matching distribution found for ([A-Za-z0-9][A-Za-z0-9._\-\[\],<>=!~ ]*)"),
    re.compile(
        r"Because ([A-Za-z0-9][A-Za-z0-9._\-]*)(?:[<>=!~]=?[^\s]*)? was not found in the package registry"
    ),
    re.compile(r"Because there is no version of ([A-Za-z0-9][A-Za-z0-9._\-]*[<>=!~]=?[^\s]*)"),
)


def missing_packages(output: str) -> list[str]:
    """The requirements an installer's ``output`` says it could not find (named, not buried in its last lines)."""
    found: list[str] = []
    for pattern in _MISSING:
        for match in pattern.findall(output):
            name = match.strip().rstrip(".")
            if name not in found:
                found.append(name)
    return found


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else text[:300]


def _name(requirement: str) -> str:
    try:
        return canonicalize_name(Requirement(requirement).name)
    except InvalidRequirement:
        return canonicalize_name(requirement.split("==")[0].strip())


def _normal(requirement: str) -> str:
    try:
        return str(Requirement(requirement))
    except InvalidRequirement:
        return requirement.strip()


# --- one driver's view: each environment prepared at most once, off the event loop ----------------------------------

_memo: dict[tuple[str, str], PreparedEnvironment | EnvironmentFailed] = {}
_locks: dict[
    tuple[int, str, str], asyncio.Lock
] = {}  # per event loop: a lock belongs to the loop it waited in


async def ensure(task: Task, cfg: SandboxConfig) -> PreparedEnvironment | None:
    """The prepared environment ``task`` runs over (built now if it must be), or None when it declares none.
    A failure is remembered for this process: every later execution of the task is refused with the same reason."""
    spec = task.environment
    if spec is None:
        return None
    memo_key = (str(cache_root(cfg)), environment_key(spec))
    async with _locks.setdefault((id(asyncio.get_running_loop()), *memo_key), asyncio.Lock()):
        if memo_key not in _memo:
            try:
                _memo[memo_key], _ = await asyncio.to_thread(prepare, spec, cfg)
            except EnvironmentFailed as exc:
                _memo[memo_key] = exc
    done = _memo[memo_key]
    if isinstance(done, EnvironmentFailed):
        raise EnvironmentFailed(f"task {task.id} (environment): it could not be built: {done}")
    return done


def forget() -> None:
    """Drop this process's memory of prepared and failed environments (tests; a retry after fixing the cause)."""
    _memo.clear()
    _locks.clear()


async def ensure_path(task: Task, cfg: SandboxConfig) -> Path | None:
    """`ensure`, as the directory a sandbox shows."""
    done = await ensure(task, cfg)
    return None if done is None else Path(done.path)

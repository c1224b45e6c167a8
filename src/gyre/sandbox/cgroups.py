"""One cgroup per sandbox: a process limit that holds even for root, a memory limit, and a kill switch.

``RLIMIT_NPROC`` is not enforced for uid 0, so when the driver runs as root only a cgroup (or another uid, see
`gyre.sandbox.limits`) stops a fork bomb. Sandbox cgroups are created under the driver's own cgroup in each
hierarchy that is mounted and writable: the ``pids`` and ``memory`` controllers (cgroup v2, or v1 on hybrid hosts),
and a v2 directory for ``cgroup.kill`` (present even where v2 has no controllers). Every process a sandbox starts
joins them before it execs anything (the launcher writes its pid first), so nothing it forks is outside.

Files here are kernel pseudo-files: reads and writes never wait on a disk. Creation and removal still run in a
thread (removal waits for processes to die).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
import signal
import time
from pathlib import Path

from gyre.errors import SandboxError


@dataclasses.dataclass(frozen=True, slots=True)
class Hierarchy:
    """Where this process's cgroup lies in one mounted hierarchy."""

    own: Path  # this process's cgroup directory; sandbox cgroups are created inside it
    version: int  # 1 or 2


@dataclasses.dataclass(frozen=True, slots=True)
class CgroupSupport:
    """The writable cgroup hierarchies of this host, as far as sandboxes need them."""

    pids: Hierarchy | None
    memory: Hierarchy | None
    unified: Path | None  # a v2 directory of ours, for cgroup.kill

    def describe(self) -> str:
        """One line for users: which hierarchy bounds what."""
        parts = []
        for name, h in (("pids", self.pids), ("memory", self.memory)):
            parts.append(f"{name}: cgroup v{h.version} ({h.own})" if h else f"{name}: no writable cgroup")
        parts.append("kill: cgroup.kill" if self.unified else "kill: signals to each process")
        return "; ".join(parts)


def _mounts() -> list[tuple[str, str, str, str]]:
    """(mount root, mount point, fs type, super options) of each cgroup mount, from /proc/self/mountinfo."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        head, _, tail = line.partition(" - ")
        fields, tail_fields = head.split(), tail.split()
        if len(fields) >= 5 and len(tail_fields) >= 3 and tail_fields[0] in ("cgroup", "cgroup2"):
            out.append((fields[3], fields[4].replace("\\040", " "), tail_fields[0], tail_fields[2]))
    return out


def _own_dir(mount_root: str, mount_point: str, path: str) -> Path | None:
    """This process's cgroup directory under a mount, if the mount shows it."""
    if mount_root != "/" and not (path == mount_root or path.startswith(mount_root + "/")):
        return None
    rel = path[len(mount_root) :] if mount_root != "/" else path
    own = Path(mount_point) / rel.lstrip("/")
    return own if own.is_dir() and os.access(own, os.W_OK) else None


def _enable_v2(own: Path, controller: str) -> bool:
    """Whether children of ``own`` get ``controller`` (enabling it when allowed)."""
    try:
        if controller not in (own / "cgroup.controllers").read_text().split():
            return False
        if controller in (own / "cgroup.subtree_control").read_text().split():
            return True
        (own / "cgroup.subtree_control").write_text(f"+{controller}")
        return True
    except OSError:  # EBUSY: ``own`` has processes and is not a root; EACCES: not delegated to us
        return False


@functools.cache
def support() -> CgroupSupport:
    """Discover (once per process) the cgroup hierarchies sandboxes can use."""
    try:
        cgroup_lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = _mounts()
    except OSError:
        return CgroupSupport(None, None, None)
    paths: dict[str, str] = {}  # controller (or "" for v2) -> this process's path
    for line in cgroup_lines:
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(","):
            paths[c] = path
    found: dict[str, Hierarchy] = {}
    unified = None
    for root, point, fstype, opts in mounts:
        if fstype == "cgroup2" and "" in paths:
            own = _own_dir(root, point, paths[""])
            if own is None:
                continue
            unified = unified or (own if (own / "cgroup.procs").exists() else None)
            for c in ("pids", "memory"):
                if c not in found and _enable_v2(own, c):
                    found[c] = Hierarchy(own, 2)
        elif fstype == "cgroup":
            for c in ("pids", "memory"):
                if c in opts.split(",") and c in paths and c not in found:
                    own = _own_dir(root, point, paths[c])
                    if own is not None:
                        found[c] = Hierarchy(own, 1)
    return CgroupSupport(found.get("pids"), found.get("memory"), unified)


def _read_counter(path: Path, key: str) -> int:
    """The value of ``key`` in a flat-keyed cgroup file (``pids.events``, ``memory.events``), 0 if absent."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


class SandboxCgroup:
    """The cgroups of one sandbox (blocking methods: call them in a thread, except `counters`)."""

    def __init__(self, name: str, max_processes: int, memory_bytes: int, cg: CgroupSupport) -> None:
        """Create the cgroups named ``name`` and set their limits; SandboxError if the host refuses."""
        self.dirs: list[Path] = []
        self.memory_limited = cg.memory is not None
        self._pids_events: Path | None = None
        self._oom_file: Path | None = None
        self._oom_key = "oom_kill"
        self._kill_dir: Path | None = None
        try:
            if cg.pids is not None:
                pids = self._make(cg.pids.own / name)
                (pids / "pids.max").write_text(str(max_processes))
                self._pids_events = pids / "pids.events"
            if cg.memory is not None:
                mem = self._make(cg.memory.own / name)
                if cg.memory.version == 2:
                    (mem / "memory.max").write_text(str(memory_bytes))
                    with contextlib.suppress(FileNotFoundError):
                        (mem / "memory.swap.max").write_text("0")
                    self._oom_file = mem / "memory.events"
                else:
                    (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
                    with contextlib.suppress(FileNotFoundError):
                        (mem / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                    self._oom_file = mem / "memory.oom_control"
            if cg.unified is not None:
                self._kill_dir = self._make(cg.unified / name)
        except OSError as exc:
            self.remove()
            raise SandboxError(f"cannot set up the sandbox's cgroup {name}: {exc}") from None

    def _make(self, path: Path) -> Path:
        if path not in self.dirs:
            path.mkdir()
            self.dirs.append(path)
        return path

    @property
    def procs_files(self) -> list[str]:
        """The files a process writes its pid to, to join every cgroup of the sandbox."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def counters(self) -> tuple[int, int]:
        """(OOM kills, forks refused at the process limit) so far; compare before and after a command."""
        ooms = _read_counter(self._oom_file, self._oom_key) if self._oom_file else 0
        refused = _read_counter(self._pids_events, "max") if self._pids_events else 0
        return ooms, refused

    def pids(self) -> set[int]:
        """Every process in the sandbox's cgroups now."""
        found: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return found

    def kill(self) -> None:
        """SIGKILL every process in the cgroups (at once with cgroup.kill where the kernel has it)."""
        if self._kill_dir is not None:
            with contextlib.suppress(OSError):
                (self._kill_dir / "cgroup.kill").write_text("1")
        for pid in self.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, timeout_s: float = 10.0) -> None:
        """Kill what is left, wait for it to die and remove the cgroups; SandboxError if they stay busy."""
        deadline = time.monotonic() + timeout_s
        for d in reversed(self.dirs):
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise SandboxError(f"cannot remove the sandbox cgroup {d}: {exc.strerror}") from None
                    self.kill()
                    time.sleep(0.01)
        self.dirs.clear()

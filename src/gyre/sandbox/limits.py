"""Resource limits: how each is enforced on this host, the launcher that applies them, and telling which one hit.

Every command starts through a launcher on the host, before any sandbox code runs:
``bash -c '<close fds>; echo $$ > <cgroup>/cgroup.procs ...; exec "$@"' prlimit --cpu=.. --fsize=.. -- <command>``.
``bash`` closes every descriptor above stderr the driver let it inherit (uvloop does not close them, whatever
``close_fds`` says), joins the sandbox's cgroups (so everything forked later is inside) and may open one file for
the backend on descriptor 3; ``prlimit`` sets the rlimits; under a root driver the bubblewrap backend then takes
the sandbox's own unprivileged uid with ``setpriv`` (`own_uid`). Each ``exec``s the next, so the limits hold for
the backend's own processes (bwrap) and everything below. None needs the driver to run Python in the child (a
``preexec_fn`` forces a real fork of the driver, slow with a large heap, and uvloop refuses ``user=``).

Containment modes (``SandboxConfig.containment``):

- ``cgroup`` (auto's choice where a pids cgroup is writable, as on a root host with cgroupfs mounted rw):
  processes: ``pids.max``; memory: ``memory.max`` / ``memory.limit_in_bytes`` of all the sandbox's processes
  together (OOM kill on excess, counted by the kernel); leftovers killed with ``cgroup.kill``.
- ``uid`` (auto's choice as root without cgroups; bubblewrap only): each sandbox's own unprivileged uid is also
  what bounds its processes, with ``RLIMIT_NPROC`` (never enforced for uid 0); memory: ``RLIMIT_AS`` per process.
- ``rlimit`` (otherwise): memory: ``RLIMIT_AS`` per process; processes are *not* bounded (``RLIMIT_NPROC``
  would count all of the user's processes, the driver's included); the wall timeout and, with bubblewrap, the
  pid namespace are all that stop a fork bomb.

In every mode: CPU time ``RLIMIT_CPU`` (per process: SIGXCPU, then SIGKILL), file size ``RLIMIT_FSIZE``, open files
``RLIMIT_NOFILE``, no core dumps, and the wall-clock timeout kills the whole tree. Whatever the mode, a bubblewrap
sandbox of a root driver runs as its own unprivileged uid: never as host root.
"""

from __future__ import annotations

import functools
import logging
import os
import shlex
import shutil
from collections.abc import Sequence
from typing import Literal

from gyre.config import SandboxConfig
from gyre.errors import SandboxError
from gyre.sandbox import cgroups

log = logging.getLogger(__name__)

Containment = Literal["cgroup", "uid", "rlimit"]
JOIN_FAILED_EXIT = 125  # the launcher's exit code when it could not join the sandbox's cgroups or bind a path
MIB = 1 << 20


@functools.cache
def tool(name: str) -> str:
    """The absolute path of a host tool the launcher needs; SandboxError naming the package when missing."""
    path = shutil.which(name, path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    if path is None:
        package = {"prlimit": "util-linux", "setpriv": "util-linux", "bwrap": "bubblewrap"}.get(name, name)
        raise SandboxError(f"{name} is not installed; install it with `apt-get install {package}`")
    return path


def own_uid(isolating: bool) -> bool:
    """Whether each sandbox runs as an unprivileged uid of its own: always for bubblewrap (``isolating``) under a
    root driver, in every containment mode (host root inside a sandbox could write /proc/sys, leave setuid-root
    files in the workspace...); otherwise commands run as the driver's uid, which holds no privilege to lose."""
    return isolating and os.geteuid() == 0


def setpriv_argv(uid: int) -> list[str]:
    """``setpriv`` becoming ``uid`` (as its gid too, no supplementary groups, no capabilities even in its bounding
    set, no_new_privs), ready to take the command after it."""
    become = ["--reuid", str(uid), "--regid", str(uid), "--clear-groups", "--inh-caps=-all"]
    return [tool("setpriv"), *become, "--bounding-set=-all", "--no-new-privs", "--"]


def choose_containment(cfg: SandboxConfig, isolating: bool) -> Containment:
    """The containment mode for sandboxes of ``cfg`` (``isolating``: the bubblewrap backend)."""
    cg = cgroups.support()
    mode = cfg.containment
    if mode == "auto":
        if cg.pids is not None:
            return "cgroup"
        if isolating and os.geteuid() == 0:
            return "uid"
        _warn_unbounded()
        return "rlimit"
    if mode == "cgroup" and cg.pids is None:
        raise SandboxError(
            "sandbox.containment = 'cgroup' but no writable pids cgroup was found (is /sys/fs/cgroup mounted "
            "read-write?); choose 'auto'"
        )
    if mode == "uid" and not (isolating and os.geteuid() == 0):
        raise SandboxError(
            "sandbox.containment = 'uid' needs the bubblewrap backend and a driver running as root"
        )
    if mode == "rlimit":
        _warn_unbounded()
    return mode


@functools.cache
def _warn_unbounded() -> None:
    log.warning(
        "sandbox processes are not bounded (containment 'rlimit': no writable cgroup, and not root or not "
        "bubblewrap): a fork bomb runs until its wall timeout"
    )


def describe(mode: Containment, cfg: SandboxConfig) -> str:
    """How each limit is enforced in ``mode``, for users checking their set-up."""
    cg = cgroups.support()
    cpu = f"cpu {cfg.cpu_time_s} s/process (RLIMIT_CPU)"
    files = f"file size {cfg.file_size_mib} MiB (RLIMIT_FSIZE), open files {cfg.open_files} (RLIMIT_NOFILE)"
    if mode == "cgroup":
        mem = "cgroup, whole sandbox" if cg.memory else "RLIMIT_AS, per process"
        procs = f"processes {cfg.max_processes} (pids cgroup), memory {cfg.memory_mib} MiB ({mem})"
    elif mode == "uid":
        procs = (
            f"processes {cfg.max_processes} (own uid + RLIMIT_NPROC), memory {cfg.memory_mib} MiB (RLIMIT_AS)"
        )
    else:
        procs = f"processes unbounded, memory {cfg.memory_mib} MiB (RLIMIT_AS, per process)"
    who = "; runs as its own unprivileged uid" if own_uid(cfg.backend == "bubblewrap") else ""
    return f"{procs}; {cpu}; {files}{who}"


def prlimit_argv(cfg: SandboxConfig, mode: Containment, memory_in_cgroup: bool) -> list[str]:
    """``prlimit`` with the rlimits of ``mode``, ready to take the command after it."""
    argv = [
        tool("prlimit"),
        f"--cpu={cfg.cpu_time_s}:{cfg.cpu_time_s + 5}",
        f"--fsize={cfg.file_size_mib * MIB}",
        f"--nofile={cfg.open_files}",
        "--core=0",
    ]
    if mode == "uid":
        argv.append(f"--nproc={cfg.max_processes}")
    if not memory_in_cgroup:
        argv.append(f"--as={cfg.memory_mib * MIB}")
    return [*argv, "--"]


def join_argv(
    procs_files: list[str], fd3: str | None = None, staged: Sequence[tuple[str, str]] = ()
) -> list[str]:
    """The launcher's ``bash``: it closes every descriptor above stderr, joins the cgroups whose ``cgroup.procs``
    files are given, opens ``fd3`` (if any) read-only on descriptor 3, then execs its arguments.

    ``staged``: (host path, mount point) pairs bound in a mount namespace of the launcher's own (``unshare``, so
    the host sees nothing), for a backend running as a uid that cannot reach the host paths themselves.
    """
    # {n}>&- closes the descriptor numbered $n (any number: sh only knows 0-9); the glob's own, already closed
    # descriptor fails quietly.
    script = "for f in /proc/self/fd/*; do n=${f##*/}; ((n > 2)) && { exec {n}>&-; } 2>/dev/null; done; "
    if procs_files:
        joins = " && ".join(f"echo $$ > {shlex.quote(f)}" for f in procs_files)
        failed = f"{{ echo 'gyre: cannot join the sandbox cgroup' >&2; exit {JOIN_FAILED_EXIT}; }}"
        script += f"{{ {joins}; }} 2>/dev/null || {failed}; "
    for host, point in staged:
        mount = f"{shlex.quote(tool('mount'))} --rbind -- {shlex.quote(host)} {shlex.quote(point)}"
        failed = f"{{ printf 'gyre: cannot bind %s\\n' {shlex.quote(host)} >&2; exit {JOIN_FAILED_EXIT}; }}"
        script += f"{mount} || {failed}; "
    script += 'exec "$@"' + (f" 3<{shlex.quote(fd3)}" if fd3 is not None else "")
    unshare = [tool("unshare"), "--mount", "--propagation", "private", "--"] if staged else []
    return [*unshare, tool("bash"), "--norc", "--noprofile", "-c", script, "bash"]


_MEMORY_WORDS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
_PROCESS_WORDS = ("fork: retry", "fork: Resource temporarily unavailable", "can't start new thread")


def classify(
    exit_code: int, killed_by: str | None, stderr: str, oom_kills: int, refused_forks: int
) -> str | None:
    """Which limit a command hit, if one can tell: kernel counters first, then signals, then error messages.

    ``oom_kills`` and ``refused_forks`` are the sandbox cgroup's counters' increase during the command. Messages
    are heuristics (a command may print them for other reasons): read only when the command failed, except the
    shells' own "fork: retry" (where no cgroup counts refused forks, a contained fork bomb may still exit 0).
    """
    if oom_kills > 0:
        return "memory"
    if refused_forks > 0:
        return "processes"
    if killed_by == "SIGXCPU":
        return "cpu_time"
    if killed_by == "SIGXFSZ":
        return "file_size"
    if "fork: retry" in stderr:
        return "processes"
    if exit_code == 0:
        return None
    if any(w in stderr for w in _MEMORY_WORDS):
        return "memory"
    if any(w in stderr for w in _PROCESS_WORDS):
        return "processes"
    if "File too large" in stderr:
        return "file_size"
    if "Too many open files" in stderr:
        return "open_files"
    return None

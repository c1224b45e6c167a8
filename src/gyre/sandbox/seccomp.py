"""The seccomp filter every bubblewrap command runs under: the few system calls that could leave the sandbox a way
out, or leave the host something dangerous in the workspace.

What it refuses (everything else is allowed):

- setuid/setgid bits and device nodes, however made: ``chmod``/``fchmod``/``fchmodat``/``fchmodat2`` with
  S_ISUID or S_ISGID, ``open``/``openat``/``creat`` creating a file with them, ``mknod``/``mknodat`` of a
  character or block device (even the 0:0 whiteout an unprivileged user may otherwise make) or with those bits,
  ``renameat2(RENAME_WHITEOUT)``. The workspace is a host directory: such a file would keep its bit (or stay a
  device) for whoever on the host touches it later. ``openat2`` (its mode is out of the filter's reach) answers
  ENOSYS, which callers take as "use openat".
- the kernel keyrings (``keyctl``, ``add_key``, ``request_key``): they are not namespaced, and a command would
  otherwise inherit the driver's session keyring and read its keys;
- ``io_uring_*`` (its operations bypass this filter), ``bpf`` and ``userfaultfd`` (kernel attack surface no
  agent needs).

System calls of another ABI (i386 ``int 0x80`` on x86-64, x32) would dodge the numbers below: a foreign
architecture kills the process, x32 calls answer ENOSYS. bwrap installs the filter (``--seccomp FD``) after it has
set up the namespaces, just before it executes the command.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import os
import platform
import struct
import tempfile
from typing import NamedTuple

# classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h)
_LD_ABS, _JEQ, _JGE, _JSET, _AND, _RET = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data; args[i] at 16 + 8 i (low 32 bits first: little endian)
_X32_BIT = 0x40000000

SETID = 0o6000  # S_ISUID | S_ISGID
_S_IFMT, _S_IFCHR, _S_IFBLK = 0o170000, 0o020000, 0o060000
_O_CREAT, _O_TMPFILE = 0o100, 0o20000000  # the same on x86-64 and aarch64
_RENAME_WHITEOUT = 4


class _Arch(NamedTuple):
    audit: int  # AUDIT_ARCH_* as seccomp_data.arch reports it
    x32: bool  # whether nr >= _X32_BIT is another ABI on this architecture
    nr: dict[str, int]  # system call numbers; absent: the architecture has no such call


_ARCHES = {
    "x86_64": _Arch(
        0xC000003E,
        True,
        {
            "open": 2, "creat": 85, "chmod": 90, "fchmod": 91, "mknod": 133, "add_key": 248, "request_key": 249,
            "keyctl": 250, "openat": 257, "mknodat": 259, "fchmodat": 268, "renameat2": 316, "bpf": 321,
            "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
            "openat2": 437, "fchmodat2": 452,
        },
    ),
    "aarch64": _Arch(
        0xC00000B7,
        False,
        {
            "mknodat": 33, "fchmod": 52, "fchmodat": 53, "openat": 56, "add_key": 217, "request_key": 218,
            "keyctl": 219, "renameat2": 276, "bpf": 280, "userfaultfd": 282, "io_uring_setup": 425,
            "io_uring_enter": 426, "io_uring_register": 427, "openat2": 437, "fchmodat2": 452,
        },
    ),
}  # fmt: skip

_DENIED = {
    "keyctl": errno.EPERM, "add_key": errno.EPERM, "request_key": errno.EPERM, "bpf": errno.EPERM,
    "userfaultfd": errno.EPERM, "io_uring_setup": errno.ENOSYS, "io_uring_enter": errno.ENOSYS,
    "io_uring_register": errno.ENOSYS, "openat2": errno.ENOSYS,
}  # fmt: skip
_CHMODS = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2}  # call -> index of its mode argument
_OPENS = {"open": (1, 2), "openat": (2, 3)}  # call -> (flags, mode) argument indexes
_MKNODS = {"mknod": 1, "mknodat": 2}


def _arg(i: int) -> int:
    return 16 + 8 * i


class _Asm:
    """A classic BPF program with forward jumps to labels (resolved by `code`)."""

    def __init__(self) -> None:
        self.ins: list[tuple[int, int | str, int | str, int]] = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int, jt: int | str = 0, jf: int | str = 0) -> None:
        self.ins.append((code, jt, jf, k))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.ins)

    def code(self) -> bytes:
        out = b""
        for at, (code, jt, jf, k) in enumerate(self.ins):
            jumps = [self.labels[j] - at - 1 if isinstance(j, str) else j for j in (jt, jf)]
            assert all(0 <= j < 256 for j in jumps), "a BPF jump is forward and short"
            out += struct.pack("=HBBI", code, jumps[0], jumps[1], k)
        return out


def program(machine: str) -> bytes:
    """The filter for ``machine`` (``platform.machine()``), as bwrap reads it: an array of sock_filter."""
    arch = _ARCHES[machine]
    eperm = _ERRNO | errno.EPERM
    a = _Asm()
    a.op(_LD_ABS, _ARCH)
    a.op(_JEQ, arch.audit, jt=1)
    a.op(_RET, _KILL_PROCESS)
    a.op(_LD_ABS, _NR)
    if arch.x32:
        a.op(_JGE, _X32_BIT, jf=1)
        a.op(_RET, _ERRNO | errno.ENOSYS)
    for name, err in _DENIED.items():
        if name in arch.nr:
            a.op(_JEQ, arch.nr[name], jf=1)
            a.op(_RET, _ERRNO | err)
    # Each check below starts with the call's number in A and ends at "deny" or, having loaded an argument,
    # at its own "next" label, which reloads the number.
    for name, mode_arg in _CHMODS.items():
        if name in arch.nr:
            a.op(_JEQ, arch.nr[name], jf=f"skip-{name}")
            a.op(_LD_ABS, _arg(mode_arg))
            a.op(_JSET, SETID, jt="deny", jf="allow")
            a.label(f"skip-{name}")
    for name, (flags_arg, mode_arg) in _OPENS.items():
        if name in arch.nr:
            a.op(_JEQ, arch.nr[name], jf=f"skip-{name}")
            a.op(_LD_ABS, _arg(flags_arg))
            a.op(_JSET, _O_CREAT | _O_TMPFILE, jf="allow")
            a.op(_LD_ABS, _arg(mode_arg))
            a.op(_JSET, SETID, jt="deny", jf="allow")
            a.label(f"skip-{name}")
    if "creat" in arch.nr:
        a.op(_JEQ, arch.nr["creat"], jf="skip-creat")
        a.op(_LD_ABS, _arg(1))
        a.op(_JSET, SETID, jt="deny", jf="allow")
        a.label("skip-creat")
    for name, mode_arg in _MKNODS.items():
        if name in arch.nr:
            a.op(_JEQ, arch.nr[name], jf=f"skip-{name}")
            a.op(_LD_ABS, _arg(mode_arg))
            a.op(_JSET, SETID, jt="deny")
            a.op(_AND, _S_IFMT)
            a.op(_JEQ, _S_IFCHR, jt="deny")
            a.op(_JEQ, _S_IFBLK, jt="deny", jf="allow")
            a.label(f"skip-{name}")
    a.op(_JEQ, arch.nr["renameat2"], jf="allow")
    a.op(_LD_ABS, _arg(4))
    a.op(_JSET, _RENAME_WHITEOUT, jt="deny", jf="allow")
    a.label("allow")
    a.op(_RET, _ALLOW)
    a.label("deny")
    a.op(_RET, eperm)
    return a.code()


@functools.cache
def filter_file() -> str | None:
    """A file holding this machine's filter, written once per process (None: an architecture we have no numbers
    for, where commands run without the filter)."""
    machine = platform.machine()
    if machine not in _ARCHES:
        return None
    fd, path = tempfile.mkstemp(prefix=f"gyre-seccomp-{os.getpid()}-", suffix=".bpf")
    atexit.register(_unlink, path)
    with os.fdopen(fd, "wb") as f:
        f.write(program(machine))
    return path


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)

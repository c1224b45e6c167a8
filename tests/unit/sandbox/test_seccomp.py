"""The seccomp filter's decisions, read by a small classic-BPF interpreter over the program bwrap is given."""

from __future__ import annotations

import errno
import os
import struct

import pytest

from gyre.sandbox.seccomp import _ARCHES, program

ALLOW, KILL = 0x7FFF0000, 0x80000000
EPERM, ENOSYS = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS


def run(code: bytes, arch: int, nr: int, *args: int) -> int:
    """What the filter returns for one system call (the subset of classic BPF that seccomp filters use)."""
    data = struct.pack("=iI8x", nr, arch) + b"".join(
        struct.pack("=Q", a % (1 << 64)) for a in (*args, 0, 0, 0, 0, 0, 0)[:6]
    )
    ins = [struct.unpack_from("=HBBI", code, i) for i in range(0, len(code), 8)]
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = ins[pc]
        pc += 1
        if op == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
        elif op == 0x54:  # and #k
            acc &= k
        elif op == 0x06:  # ret #k
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]
            pc += jt if taken else jf


@pytest.mark.parametrize("machine", sorted(_ARCHES))
def test_setid_bits_and_devices_are_refused_and_the_rest_allowed(machine: str) -> None:
    arch = _ARCHES[machine]
    code, nr, a = program(machine), arch.nr, arch.audit
    assert run(code, a, nr["fchmodat"], -100, 0, 0o4755) == EPERM
    assert run(code, a, nr["fchmodat"], -100, 0, 0o2775) == EPERM
    assert run(code, a, nr["fchmodat"], -100, 0, 0o1777) == ALLOW  # sticky is harmless
    assert run(code, a, nr["fchmod"], 3, 0o644) == ALLOW
    assert run(code, a, nr["openat"], -100, 0, os.O_CREAT | os.O_WRONLY, 0o6755) == EPERM
    assert run(code, a, nr["openat"], -100, 0, os.O_WRONLY, 0o6755) == ALLOW  # no creation: mode unused
    assert run(code, a, nr["openat"], -100, 0, os.O_CREAT | os.O_WRONLY, 0o644) == ALLOW
    assert run(code, a, nr["mknodat"], -100, 0, 0o020644, 0) == EPERM  # even the 0:0 whiteout
    assert run(code, a, nr["mknodat"], -100, 0, 0o060644, 0x700) == EPERM
    assert run(code, a, nr["mknodat"], -100, 0, 0o104755, 0) == EPERM
    assert run(code, a, nr["mknodat"], -100, 0, 0o010644, 0) == ALLOW  # a FIFO
    assert run(code, a, nr["renameat2"], -100, 0, -100, 0, 4) == EPERM  # RENAME_WHITEOUT
    assert run(code, a, nr["renameat2"], -100, 0, -100, 0, 1) == ALLOW  # RENAME_NOREPLACE
    for name in ("keyctl", "add_key", "request_key", "bpf", "userfaultfd"):
        assert run(code, a, nr[name]) == EPERM, name
    for name in ("io_uring_setup", "openat2"):
        assert run(code, a, nr[name]) == ENOSYS, name
    assert run(code, a, 0) == ALLOW and run(code, a, nr["openat"] + 1000) == ALLOW
    assert run(code, 0x40000003, 5) == KILL  # i386 system calls on x86-64: another table of numbers
    if arch.x32:
        assert run(code, a, 0x40000000 | nr["chmod"], 0, 0o4755) == ENOSYS


def test_x86_64_legacy_calls_are_covered() -> None:
    arch = _ARCHES["x86_64"]
    code, nr, a = program("x86_64"), arch.nr, arch.audit
    assert run(code, a, nr["chmod"], 0, 0o4755) == EPERM
    assert run(code, a, nr["creat"], 0, 0o2755) == EPERM
    assert run(code, a, nr["open"], 0, os.O_CREAT, 0o4700) == EPERM
    assert run(code, a, nr["mknod"], 0, 0o020600, 0x103) == EPERM
    assert run(code, a, nr["fchmodat2"], -100, 0, 0o4755, 0) == EPERM

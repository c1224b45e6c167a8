"""What a shell inside a bubblewrap sandbox could do to the host with privileges it should not have.

Written for the host CI runs on, where the driver is root and ``auto`` picks cgroup containment: each test runs in
every containment mode this host offers. A sandbox must never run as a privileged host uid, keep a capability,
write a kernel knob, leave a setuid file or a device in the workspace, read the driver's keys or use a
descriptor the driver holds.
"""

from __future__ import annotations

import asyncio
import os
import random
import stat
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from proc_scan import status, wait_process

from gyre.config import SandboxConfig
from gyre.sandbox import make_sandbox


def _containments() -> list[str]:
    return ["cgroup", "uid"] if os.geteuid() == 0 else ["rlimit"]


def _with(cfg: SandboxConfig, containment: str) -> SandboxConfig:
    return msgspec.structs.replace(cfg, containment=containment)


@pytest.mark.parametrize("containment", ["cgroup", "uid", "rlimit"] if os.geteuid() == 0 else ["rlimit"])
def test_commands_never_run_as_a_privileged_host_uid(cfg: SandboxConfig, containment: str) -> None:
    marker = f"{3000 + random.random():.9f}"

    async def go() -> None:
        async with make_sandbox(_with(cfg, containment)) as sb, asyncio.TaskGroup() as tg:
            r = await sb.exec("grep -E '^(Cap|NoNewPrivs|Seccomp:)' /proc/self/status; touch made; mkdir dir")
            inside = dict(line.split(":\t") for line in r.stdout.splitlines())
            assert all(inside[c] == "0000000000000000" for c in ("CapInh", "CapPrm", "CapEff", "CapBnd")), r
            assert inside["CapAmb"] == "0000000000000000" and inside["NoNewPrivs"] == "1", r
            assert inside["Seccomp"] == "2", r  # filtering
            r = await sb.exec("grep -E ' /(workspace|tmp) ' /proc/self/mountinfo")
            options = [line.split()[5].split(",") for line in r.stdout.splitlines()]
            assert len(options) == 2 and all({"nosuid", "nodev"} <= set(o) for o in options), r
            sleeping = tg.create_task(sb.exec(f"sleep {marker}"))
            pid = await asyncio.to_thread(wait_process, f"sleep {marker}")
            host = status(pid)
            sleeping.cancel()
            uids = {int(u) for u in host["Uid"].split() + host["Gid"].split()}
            if os.geteuid() == 0:
                assert 0 not in uids and len(uids) == 1, host  # one unprivileged uid, as its gid too
            else:
                assert uids <= {os.getuid(), os.getgid()}, host
            assert host["CapEff"] == host["CapPrm"] == "0000000000000000" and host["NoNewPrivs"] == "1", host
            owners = {(sb.workspace / n).stat().st_uid for n in ("made", "dir")}
            assert owners == ({uids.pop()} if os.geteuid() == 0 else {os.getuid()}), owners

    asyncio.run(go())


@pytest.mark.parametrize("containment", _containments())
def test_proc_sys_and_other_kernel_knobs_are_read_only(cfg: SandboxConfig, containment: str) -> None:
    knobs = [
        "kernel/core_pattern",
        "kernel/modprobe",
        "vm/drop_caches",
        "net/ipv4/ip_forward",
        "kernel/hostname",
    ]
    before = Path("/proc/sys/kernel/core_pattern").read_text()
    # opened for writing and closed without a write: harmless even where the knob is writable (on a regression)
    probe = (
        "import sys\n"
        "for knob in sys.argv[1:]:\n"
        "    try:\n"
        "        open('/proc/sys/' + knob, 'w').close(); print('WRITABLE', knob)\n"
        "    except OSError as e:\n"
        "        print('refused', knob, e.strerror)\n"
    )

    async def go() -> None:
        async with make_sandbox(_with(cfg, containment)) as sb:
            r = await sb.exec(["python3", "-c", probe, *knobs])
            assert r.ok and "WRITABLE" not in r.stdout and r.stdout.count("refused") == len(knobs), r
            r = await sb.exec("grep ' /proc ' /proc/self/mountinfo")
            assert "ro" in r.stdout.split()[5].split(","), (
                r
            )  # all of it: its own entries are no way out either

    asyncio.run(go())
    assert Path("/proc/sys/kernel/core_pattern").read_text() == before


SETID_AND_DEVICES = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def attempt(what, call):
    try:
        call(); print('MADE', what)
    except OSError as e:
        print('refused', what, e.strerror)
def whiteout():
    open('w', 'w').close()
    if libc.renameat2(-100, b'w', -100, b'w2', 4) != 0:  # RENAME_WHITEOUT: leaves a 0:0 device at 'w'
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
import shutil; shutil.copy('/usr/bin/id', 'suid'); os.mkdir('sgid-dir')
attempt('chmod u+s', lambda: os.chmod('suid', 0o4755))
attempt('chmod g+s', lambda: os.chmod('suid', 0o2755))
attempt('fchmod u+s', lambda: os.fchmod(os.open('suid', os.O_RDONLY), 0o4755))
attempt('chmod g+s dir', lambda: os.chmod('sgid-dir', 0o2755))
attempt('open 4755', lambda: os.close(os.open('made-suid', os.O_CREAT | os.O_WRONLY, 0o4755)))
attempt('openat 2755', lambda: os.close(os.open('made-sgid', os.O_CREAT | os.O_WRONLY, 0o2755, dir_fd=os.open('.', os.O_RDONLY))))
attempt('mknod char 0:0', lambda: os.mknod('char', 0o644 | 0o020000, 0))
attempt('mknod char 1:3', lambda: os.mknod('null', 0o666 | 0o020000, os.makedev(1, 3)))
attempt('mknod block', lambda: os.mknod('block', 0o644 | 0o060000, os.makedev(7, 0)))
attempt('mknod suid file', lambda: os.mknod('suid-file', 0o4755 | 0o100000))
attempt('whiteout', whiteout)
os.mkfifo('fifo'); os.chmod('fifo', 0o600); print('fifo and plain chmod work')
"""


@pytest.mark.parametrize("containment", _containments())
def test_no_setuid_setgid_or_device_file_reaches_the_host(cfg: SandboxConfig, containment: str) -> None:
    async def go() -> None:
        async with make_sandbox(_with(cfg, containment)) as sb:
            r = await sb.exec(["python3", "-c", SETID_AND_DEVICES])
            assert r.ok and "fifo and plain chmod work" in r.stdout, r
            assert "MADE" not in r.stdout and r.stdout.count("refused") == 11, r
            r = await sb.exec("cp /usr/bin/id x && chmod 4755 x; chmod g+s x; ls -l x")
            assert r.stdout.startswith("-rwxr-xr-x") and "Operation not permitted" in r.stderr, r
            await sb.exec(
                "cp -a /usr/bin/. copy-of-bin 2>/dev/null"
            )  # the host's setuid binaries lose the bit
            for dirpath, dirnames, filenames in os.walk(sb.workspace):
                for name in dirnames + filenames:
                    mode = os.lstat(os.path.join(dirpath, name)).st_mode
                    assert not mode & (stat.S_ISUID | stat.S_ISGID), (name, oct(mode))
                    assert not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)), (name, oct(mode))

    asyncio.run(go())


KEYRING_DRIVER = r"""
import asyncio, ctypes, sys
from gyre.config import SandboxConfig
from gyre.sandbox import make_sandbox
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
# keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL): a session keyring of the driver's own, as a login session has
assert libc.syscall(250, 1, None) > 0
key = libc.syscall(248, b"user", b"gyre-driver-secret", b"s3cret-payload", 14, -3)  # add_key to @s
assert key > 0, ctypes.get_errno()
READ = r'''
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
key = libc.syscall(250, 10, -3, b"user", b"gyre-driver-secret", 0)  # KEYCTL_SEARCH in @s
buf = ctypes.create_string_buffer(64)
n = libc.syscall(250, 11, key, buf, 64) if key > 0 else -1  # KEYCTL_READ
print("found", key > 0, "read", buf.raw[:n] if n > 0 else None, "errno", ctypes.get_errno())
'''
async def main():
    async with make_sandbox(SandboxConfig(containment=sys.argv[2], workspace_root=sys.argv[1])) as sb:
        r = await sb.exec(["python3", "-c", READ])
        print(r.stdout, r.stderr)
        r = await sb.exec("cat /proc/keys")
        print("keys:", r.stdout)
asyncio.run(main())
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe's system call numbers are x86-64's")
@pytest.mark.parametrize("containment", _containments())
def test_the_drivers_session_keyring_is_out_of_reach(cfg: SandboxConfig, containment: str) -> None:
    # in a child process: joining a session keyring is for the life of the process
    out = subprocess.run(
        [sys.executable, "-c", KEYRING_DRIVER, cfg.workspace_root, containment],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "found False read None" in out.stdout and "s3cret" not in out.stdout, out.stdout
    assert "gyre-driver-secret" not in out.stdout, out.stdout  # not even its name in /proc/keys


def test_the_drivers_descriptors_are_not_inherited_under_uvloop(cfg: SandboxConfig, scratch: Path) -> None:
    uvloop = pytest.importorskip("uvloop")
    secret = scratch / "driver-file"
    secret.write_text("driver secret\n")
    fd = os.open(
        secret, os.O_RDWR | os.O_APPEND
    )  # made inheritable below, as C libraries' descriptors may be
    os.set_inheritable(fd, True)
    probe = f"cat <&{fd}; echo appended >&{fd}; ls /proc/self/fd"

    async def go() -> None:
        for mode in _containments():
            async with make_sandbox(_with(cfg, mode)) as sb:
                r = await sb.exec(probe)
                assert "driver secret" not in r.stdout and "Bad file descriptor" in r.stderr, (mode, r)
                assert sorted(r.stdout.split()) == ["0", "1", "2", "3"], (mode, r)  # 3: ls's own listing

    try:
        uvloop.run(go())
    finally:
        os.close(fd)
    assert secret.read_text() == "driver secret\n"


def test_io_uring_and_userfaultfd_are_refused(cfg: SandboxConfig) -> None:
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("no seccomp filter on this architecture")
    userfaultfd = 323 if os.uname().machine == "x86_64" else 282
    probe = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "params = ctypes.create_string_buffer(120)\n"
        "for name, nr, args in (('io_uring_setup', 425, (8, params)), ('userfaultfd', UFFD, (1,))):\n"
        "    ret = libc.syscall(nr, *args)\n"
        "    print(name, ret, os.strerror(ctypes.get_errno()) if ret < 0 else 'OPEN')\n"
    ).replace("UFFD", str(userfaultfd))

    async def go() -> None:
        async with make_sandbox(cfg) as sb:
            r = await sb.exec(["python3", "-c", probe])
            assert r.ok and "OPEN" not in r.stdout, r
            assert "io_uring_setup -1 Function not implemented" in r.stdout, r  # as on a kernel without it

    asyncio.run(go())


@pytest.mark.parametrize("containment", _containments())
def test_mounts_namespaces_host_processes_and_hard_links_stay_out_of_reach(
    cfg: SandboxConfig, containment: str
) -> None:
    attempts = {
        "mount tmpfs": "mount -t tmpfs none /tmp",
        "mount cgroup2": "mkdir -p /tmp/cg && mount -t cgroup2 none /tmp/cg",
        "mount proc": "mkdir -p /tmp/p && mount -t proc proc /tmp/p",
        "remount /usr": "mount -o remount,rw /usr",
        "new user namespace": "unshare -U true",
        "new mount namespace": "unshare -m true",
        "join a host cgroup": "echo $$ > /sys/fs/cgroup/cgroup.procs",
        "hard link to /etc": "ln /etc/passwd /workspace/passwd",
        "hard link to /usr": "ln /usr/bin/id /workspace/id",
        "hard link into /tmp": "touch /workspace/f && ln /workspace/f /tmp/f",
        "setuid to another uid": "setpriv --reuid 1000 true",
        "chroot": "chroot / true",
    }

    async def go() -> None:
        async with make_sandbox(_with(cfg, containment)) as sb:
            for what, command in attempts.items():
                r = await sb.exec(command)
                assert r.exit_code != 0, (what, r)
            r = await sb.exec("ls /proc | grep -c '^[0-9]'; ls /; ls /proc/1/root")
            count, *rest = r.stdout.splitlines()
            # only its own processes: the command server (pid 1), this command's keeper, bash, ls and grep
            assert int(count) <= 5 and "workspace" in rest and "work" not in rest, r
            assert "Permission denied" in r.stderr, r  # pid 1, the server, is not dumpable: no /proc/1/root
            r = await sb.exec(f"kill -0 {os.getpid()} || echo no such process")
            assert "no such process" in r.stdout, r

    asyncio.run(go())


@pytest.mark.skipif(os.geteuid() != 0, reason="owners change only where the driver is root")
def test_a_given_workspace_keeps_its_owners_and_its_hard_links_stay_read_only(scratch: Path) -> None:
    outside = scratch / "outside.txt"  # a host file outside the workspace, hard-linked into it
    outside.write_text("host data\n")
    os.chown(outside, 1234, 1234)
    outside.chmod(0o644)
    ws = scratch / "repo"
    ws.mkdir()
    os.chown(ws, 4321, 4321)
    (ws / "mine.txt").write_text("mine\n")
    os.chown(ws / "mine.txt", 4321, 4321)
    os.link(outside, ws / "linked.txt")
    fd = os.open(ws, os.O_RDONLY)
    for _ in range(1200):  # deeper than Python's recursion limit
        os.mkdir("d", dir_fd=fd)
        fd, parent = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(parent)
    os.close(fd)
    deep = ws.joinpath(*["d"] * 1200)
    cfg = SandboxConfig(workspace_root=str(scratch))

    async def go() -> None:
        async with make_sandbox(cfg, workspace=ws) as sb:
            r = await sb.exec("echo more >> mine.txt; echo new > new.txt; mkdir e; echo pwned >> linked.txt")
            assert "linked.txt: Permission denied" in r.stderr, r
            assert (sb.workspace / "new.txt").stat().st_uid not in (0, 4321)  # the sandbox's while it runs

    asyncio.run(go())
    assert outside.read_text() == "host data\n" and (outside.stat().st_uid, outside.stat().st_gid) == (
        1234,
        1234,
    )
    assert (ws / "mine.txt").read_text() == "mine\nmore\n"
    assert deep.stat().st_uid == 0  # made by this (root) process
    for name in (".", "mine.txt", "new.txt", "e"):  # as before; new entries: the workspace's owner
        assert ((ws / name).stat().st_uid, (ws / name).stat().st_gid) == (4321, 4321), name


@pytest.mark.parametrize("containment", _containments())
def test_dev_is_read_only_and_dev_shm_is_bounded_by_the_sandboxs_memory(
    cfg: SandboxConfig, containment: str
) -> None:
    small = msgspec.structs.replace(cfg, containment=containment, memory_mib=32)
    shm = (
        "from multiprocessing import shared_memory\n"
        "s = shared_memory.SharedMemory(create=True, size=1 << 20); s.close(); s.unlink(); print('shm works')\n"
    )

    async def go() -> None:
        async with make_sandbox(small) as sb:
            r = await sb.exec("touch /dev/x; mkdir /dev/d; echo ok > /dev/null && echo null works")
            assert r.stdout == "null works\n" and r.stderr.count("Read-only file system") == 2, r
            r = await sb.exec(["python3", "-c", shm])
            assert r.ok and r.stdout == "shm works\n", r
            r = await sb.exec("df -B1 --output=size /dev/shm | tail -1")
            assert int(r.stdout) == 32 << 20, r  # not half the host's memory, outside every limit
            r = await sb.exec("head -c 64M /dev/zero > /dev/shm/fill")
            assert r.exit_code != 0, r

    asyncio.run(go())

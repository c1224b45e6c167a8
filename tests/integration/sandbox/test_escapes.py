"""Escape and abuse attempts against the bubblewrap backend.

Each must be contained and reported on its own execution, while the driver (this test process) and other
sandboxes go on working.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import resource
import socket
import subprocess
import time
from pathlib import Path

import msgspec
import pytest
from proc_scan import processes_with

from gyre.config import SandboxConfig
from gyre.sandbox import make_sandbox


def _containments() -> list[str]:
    return ["cgroup", "uid"] if os.geteuid() == 0 else ["rlimit"]


def _with(cfg: SandboxConfig, containment: str) -> SandboxConfig:
    return msgspec.structs.replace(cfg, containment=containment)


def test_no_network_not_even_to_the_hosts_loopback(cfg: SandboxConfig) -> None:
    # Proofs that send nothing off this machine, even on a regression: the host's own listeners (TCP on
    # 127.0.0.1, an abstract Unix socket, a Unix socket file in the host's /tmp) must be out of reach, and the
    # sandbox's network namespace must show no interface but lo and no route.
    name = f"gyre-escape-{random.randrange(10**9)}"
    tcp = socket.create_server(("127.0.0.1", 0))
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0{name}")
    abstract.listen()
    path = Path("/tmp", f"{name}.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(path))
    unix.listen()
    probe = (
        (
            "import socket, sys\n"
            "for family, address in ((socket.AF_INET, ('127.0.0.1', PORT)), (socket.AF_UNIX, '\\0NAME'),\n"
            "                        (socket.AF_UNIX, 'PATH')):\n"
            "    try:\n"
            "        socket.socket(family).connect(address); print('connected', address)\n"
            "    except OSError as e:\n"
            "        print('blocked', address, e.strerror)\n"
        )
        .replace("PORT", str(tcp.getsockname()[1]))
        .replace("NAME", name)
        .replace("PATH", str(path))
    )

    async def go() -> None:
        async with make_sandbox(cfg) as sb:
            r = await sb.exec(["python3", "-c", probe])
            assert r.ok and "connected" not in r.stdout and r.stdout.count("blocked") == 3, r
            r = await sb.exec(
                "cat /proc/net/dev; echo ---; cat /proc/net/route; echo ---; cat /proc/net/ipv6_route"
            )
            dev, route, route6 = r.stdout.split("---\n")
            assert re.findall(r"^\s*(\S+):", dev, re.MULTILINE) == ["lo"], r.stdout
            assert route.splitlines()[1:] == [], r.stdout  # the IPv4 routing table: its header alone
            assert all(line.split()[-1] == "lo" for line in route6.splitlines()), r.stdout

    try:
        for server in (tcp, abstract, unix):
            server.setblocking(False)
        asyncio.run(go())
        for server in (tcp, abstract, unix):
            with pytest.raises(BlockingIOError):
                server.accept()  # nobody reached the host's servers
    finally:
        for server in (tcp, abstract, unix):
            server.close()
        path.unlink(missing_ok=True)


def test_the_hosts_files_are_invisible_or_read_only(cfg: SandboxConfig) -> None:
    name = f"gyre-escape-{random.randrange(10**9)}"

    async def go() -> None:
        async with make_sandbox(cfg) as sb:
            r = await sb.exec("ls /root; cat /root/.bashrc; ls /work; cat /etc/shadow; ls /etc/ssh")
            assert r.stdout == "" and r.stderr.count("No such file") == 5, r
            for target in (f"/etc/{name}", f"/usr/{name}", f"/usr/bin/{name}", f"/{name}"):
                r = await sb.exec(f"echo x > {target}")
                assert r.exit_code != 0 and "Read-only" in r.stderr, (target, r)
            r = await sb.exec(f"echo x > /tmp/{name} && cat /tmp/{name}")  # its private /tmp
            assert r.stdout == "x\n"
            r = await sb.exec("mount -o remount,rw /usr; mount -t tmpfs none /workspace; unshare -U true")
            assert r.exit_code != 0 and r.stderr.count("denied") + r.stderr.count("failed") >= 2, r
            r = await sb.exec(f"ls {sb.root}; ls {Path(sb.root).parent}")  # its own host path
            assert r.stdout == ""

    asyncio.run(go())
    for host in (
        Path("/etc", name),
        Path("/usr", name),
        Path("/usr/bin", name),
        Path("/tmp", name),
        Path("/", name),
    ):
        assert not host.exists()


def test_another_sandboxs_workspace_cannot_be_reached(cfg: SandboxConfig) -> None:
    async def go() -> None:
        async with make_sandbox(cfg) as a, make_sandbox(cfg) as b:
            await a.write_file("secret.txt", "a's secret")
            assert (await a.exec("cat secret.txt")).stdout == "a's secret"
            paths = [a.workspace / "secret.txt", a.root / "tmp", a.workspace, a.root]
            r = await b.exec("; ".join(f"cat {p}; ls {p}" for p in paths) + "; find / -name secret.txt")
            assert "a's secret" not in r.stdout and "secret.txt" not in r.stdout, r

    asyncio.run(go())


@pytest.mark.parametrize("containment", _containments())
def test_fork_bomb_is_contained(cfg: SandboxConfig, containment: str) -> None:
    bomb_cfg = _with(cfg, containment)

    async def go() -> None:
        async with make_sandbox(bomb_cfg) as bomb, make_sandbox(cfg) as other:
            # 60 s: the limit, not the wall clock, must end it, however slow a loaded machine runs it
            running = asyncio.ensure_future(bomb.exec("b() { b | b & }; b; sleep 3", timeout_s=60))
            await asyncio.sleep(1)
            meanwhile = await other.exec("echo alive")
            assert meanwhile.ok and meanwhile.stdout == "alive\n"
            host = await asyncio.to_thread(subprocess.run, ["true"], check=False)
            assert host.returncode == 0
            r = await running
            assert r.resource_exceeded == "processes" and not r.timed_out, r
            again = await bomb.exec("echo recovered")
            assert again.ok and again.stdout == "recovered\n"

    asyncio.run(go())


@pytest.mark.parametrize("containment", _containments())
def test_memory_hog_is_killed_and_reported(cfg: SandboxConfig, containment: str) -> None:
    async def go() -> None:
        async with make_sandbox(_with(cfg, containment)) as sb:
            r = await sb.exec(["python3", "-c", "x = b'1' * (10 << 30); print('allocated')"])
            assert r.exit_code != 0 and "allocated" not in r.stdout and r.resource_exceeded == "memory", r
            assert (await sb.exec("echo fine")).ok

    asyncio.run(go())


def test_endless_loop_hits_the_wall_timeout(cfg: SandboxConfig) -> None:
    async def go() -> None:
        async with make_sandbox(cfg) as sb:
            start = time.perf_counter()
            r = await sb.exec("while true; do :; done", timeout_s=1.5)
            assert r.timed_out and r.killed_by == "SIGKILL" and not r.ok
            assert time.perf_counter() - start >= 1.5  # not before its timeout; how late after it is load

    asyncio.run(go())


def test_cpu_file_size_and_open_file_limits_are_reported(cfg: SandboxConfig) -> None:
    small = msgspec.structs.replace(cfg, cpu_time_s=1, file_size_mib=1, open_files=64)

    async def go() -> None:
        async with make_sandbox(small) as sb:
            r = await sb.exec(["python3", "-c", "while True: pass"])
            assert r.killed_by == "SIGXCPU" and r.resource_exceeded == "cpu_time" and not r.timed_out, r
            r = await sb.exec("head -c 3M /dev/zero > big")
            assert r.resource_exceeded == "file_size" and (sb.workspace / "big").stat().st_size <= 1 << 20, r
            r = await sb.exec(["python3", "-c", "fs = [open('/dev/null') for _ in range(200)]"])
            assert r.resource_exceeded == "open_files", r

    asyncio.run(go())


def test_gigabytes_of_output_are_capped_and_drained(cfg: SandboxConfig) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    async def go() -> None:
        async with make_sandbox(cfg) as sb:
            r = await sb.exec("yes", timeout_s=2)
            assert r.timed_out and r.truncated
            marker = r.stdout.rsplit("\n[gyre: output truncated after 65536 bytes; ", 1)
            # drained past the cap, not blocked once the cap and the pipe (64 KiB) filled: hundreds of MB in 2 s on
            # a quiet machine, far fewer on a loaded one; the 300 MB below, finished, proves it never blocks
            assert len(marker) == 2 and int(marker[1].split()[0]) > 16 * 65536
            r = await sb.exec("head -c 300000000 /dev/zero; echo done >&2")
            assert r.ok and r.truncated and r.stderr == "done\n"  # the command finishes: never blocked
            assert r.stdout.endswith("[gyre: output truncated after 65536 bytes; 300000000 bytes in all]")

    asyncio.run(go())
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB: bounded memory


def test_binary_output_is_decoded_with_replacement_characters(cfg: SandboxConfig) -> None:
    async def go() -> None:
        async with make_sandbox(cfg) as sb:
            r = await sb.exec("head -c 1000 /dev/urandom; head -c 1000 /dev/urandom >&2; printf '\\377end'")
            assert r.ok and r.stdout.endswith("\ufffdend") and len(r.stderr) > 100
            assert isinstance(r.stdout, str) and not r.truncated

    asyncio.run(go())


def test_killing_the_parent_or_other_processes_stays_inside(cfg: SandboxConfig) -> None:
    driver = os.getpid()

    async def go() -> None:
        async with make_sandbox(cfg) as sb, make_sandbox(cfg) as other:
            slow = asyncio.ensure_future(other.exec("sleep 2; echo other survived"))
            r = await sb.exec(
                f"kill -9 {driver} {os.getppid()}; kill -9 -1; kill -9 $PPID; kill -9 1; echo x"
            )
            assert "No such process" in r.stderr, r
            # it ends with its keeper, not with the orphaned sleep (about 1000 s, past its 60 s timeout)
            r = await sb.exec("sleep 1000 & kill -9 $PPID; sleep 0.2; echo after", timeout_s=60)
            assert not r.timed_out, r
            assert (await slow).stdout == "other survived\n"
            assert (await sb.exec("echo still works")).ok

    asyncio.run(go())
    assert os.getpid() == driver  # and this process is alive to say so


def test_daemonised_process_is_killed(cfg: SandboxConfig) -> None:
    marker = f"{1000 + random.random():.9f}"

    async def go() -> None:
        async with make_sandbox(cfg) as sb:
            # it ends without waiting for its daemon (a sleep of about 1000 s, past the 60 s timeout)
            r = await sb.exec(
                f"setsid nohup sleep {marker} >/dev/null 2>&1 & disown; echo detached", timeout_s=60
            )
            assert r.stdout == "detached\n" and not r.timed_out, r
            r = await sb.exec(["sh", "-c", f"(setsid sleep {marker} &) ; sleep 0.2"])
        assert processes_with(marker) == []

    asyncio.run(go())

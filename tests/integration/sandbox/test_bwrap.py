"""The bubblewrap sandbox as an agent uses it: commands, files, snapshots, concurrency and a clean exit."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from proc_scan import processes_with, wait_process

from gyre.config import SandboxConfig
from gyre.errors import SandboxError
from gyre.sandbox import WORKSPACE, BwrapSandbox, LocalSandbox, Snapshot, make_sandbox


def test_commands_run_with_the_system_tools(cfg: SandboxConfig) -> None:
    async def go() -> None:
        async with make_sandbox(cfg) as sb:
            assert isinstance(sb, BwrapSandbox) and sb.isolated and sb.WORKSPACE == WORKSPACE
            r = await sb.exec("python3 -c 'print(6 * 7)' && git --version && pwd && hostname")
            assert r.ok and r.stdout.splitlines()[0] == "42" and "git version" in r.stdout, r
            assert r.stdout.splitlines()[2:] == [WORKSPACE, "gyre"]
            r = await sb.exec(["sh", "-c", 'echo "$0 $1" >&2; exit 3', "a", "b c"])
            assert (r.exit_code, r.stdout, r.stderr, r.ok) == (3, "", "a b c\n", False)
            assert r.killed_by is None and not r.timed_out and not r.truncated and r.duration_s > 0
            r = await sb.exec(["no-such-program"])
            assert r.exit_code != 0 and "no-such-program" in r.stderr

    asyncio.run(go())


def test_environment_is_scrubbed_and_the_callers_is_added(
    cfg: SandboxConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GYRE_HOST_SECRET", "leak")

    async def go() -> None:
        async with make_sandbox(cfg) as sb:
            r = await sb.exec("env", env={"MY_VAR": "x y", "LANG": "C"})
            env = dict(line.split("=", 1) for line in r.stdout.splitlines())
            assert "GYRE_HOST_SECRET" not in r.stdout and "VIRTUAL_ENV" not in env
            assert env["HOME"] == WORKSPACE and env["MY_VAR"] == "x y" and env["LANG"] == "C"
            assert env["PATH"].startswith("/usr/local/sbin") and ".venv" not in env["PATH"]
            with pytest.raises(SandboxError):
                await sb.exec("true", env={"A=B": "c"})

    asyncio.run(go())


def test_cwd_and_stdin(cfg: SandboxConfig) -> None:
    async def go() -> None:
        async with make_sandbox(cfg) as sb:
            await sb.write_file("sub/dir/f.txt", "in sub")
            assert (await sb.exec("pwd; cat f.txt", cwd="sub/dir")).stdout == "/workspace/sub/dir\nin sub"
            assert (await sb.exec("pwd", cwd="/workspace/sub")).stdout == "/workspace/sub\n"
            assert (await sb.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
            missing = await sb.exec("pwd", cwd="nope")
            assert missing.exit_code != 0 and "nope" in missing.stderr
            big = "line\n" * 50_000  # more than a pipe holds: fed while the output is read
            r = await sb.exec("wc -l; cat >/dev/null", stdin=big)
            assert r.stdout.strip() == "50000"
            assert (await sb.exec("cat", stdin=b"\x00bytes")).stdout == "\x00bytes"
            assert (await sb.exec("cat")).stdout == ""  # no stdin: reads nothing, never hangs

    asyncio.run(go())


def test_files_move_between_the_host_api_and_commands(cfg: SandboxConfig) -> None:
    async def go() -> None:
        async with make_sandbox(cfg) as sb:
            await sb.write_file("/workspace/a.txt", "from the host")
            assert (await sb.exec("cat a.txt")).stdout == "from the host"
            await sb.exec("mkdir -p out && printf 'from the sandbox' > out/b.txt && ln -s /workspace/out l")
            assert await sb.read_file("out/b.txt") == b"from the sandbox"
            assert await sb.read_file("l/b.txt") == b"from the sandbox"  # an absolute link, as inside
            assert (sb.workspace / "a.txt").read_text() == "from the host"
            await sb.exec("ln -s /etc/passwd pw; ln -s /tmp tmpdir; ln -s .. up")
            for path in ("pw", "tmpdir/x", "up/x", "../x", "/etc/hostname", "/workspace/../etc/hostname"):
                with pytest.raises(SandboxError):
                    await sb.read_file(path)
                with pytest.raises(SandboxError):
                    await sb.write_file(path, "pwned")

    asyncio.run(go())
    assert "pwned" not in Path("/etc/hostname").read_text()


def _tree(root: Path) -> dict[str, tuple[int, bytes | str]]:
    """Every entry under ``root``: (mode, contents or link target)."""
    out: dict[str, tuple[int, bytes | str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            body: bytes | str = os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else ""
            out[str(p.relative_to(root))] = (st.st_mode, body)
    return out


def test_restore_makes_the_workspace_exactly_the_snapshot(cfg: SandboxConfig) -> None:
    async def go() -> None:
        async with make_sandbox(cfg) as sb, make_sandbox(cfg) as other:
            await sb.exec("mkdir -p src/pkg && echo v1 > src/pkg/m.py && echo keep > k && chmod 600 k")
            await sb.exec("ln -s src/pkg link && mkdir empty")
            before = _tree(sb.workspace)
            snap = await sb.snapshot()
            await sb.exec(
                "echo v2 > src/pkg/m.py && rm k && rm -r empty && mkdir -p new/deep && touch new/deep/f"
            )
            await sb.exec("chmod 777 src && rm link && ln -s /elsewhere link && touch .hidden")
            assert _tree(sb.workspace) != before
            await sb.restore(snap)
            assert _tree(sb.workspace) == before
            assert (await sb.exec("cat link/m.py")).stdout == "v1\n"
            await sb.exec("rm -rf ./* && echo x > y")
            await sb.restore(snap)  # a snapshot restores any number of times
            assert _tree(sb.workspace) == before
            with pytest.raises(SandboxError):
                await other.restore(snap)
            with pytest.raises(SandboxError):
                await sb.restore(Snapshot(sb.id, "999999"))

    asyncio.run(go())


def test_twenty_sandboxes_at_once_each_with_concurrent_commands(cfg: SandboxConfig) -> None:
    # each command waits at a barrier until its sandbox's three all run: they finish only if they ran at once
    barrier = "touch s{j}; while [ $(ls s? | wc -l) -lt 3 ]; do sleep 0.05; done; cat id; echo {j}"

    async def one(i: int) -> list[str]:
        async with make_sandbox(cfg) as sb:
            await sb.write_file("id", str(i))
            results = await asyncio.gather(*(sb.exec(barrier.format(j=j), timeout_s=60) for j in range(3)))
            assert not [r for r in results if r.timed_out], results
            return [r.stdout for r in results]

    async def go() -> list[list[str]]:
        return await asyncio.gather(*(one(i) for i in range(20)))

    outs = asyncio.run(go())
    assert outs == [[f"{i}{j}\n" for j in range(3)] for i in range(20)]


def test_close_kills_running_commands_and_removes_everything(cfg: SandboxConfig) -> None:
    marker = f"{1000 + random.random():.9f}"

    async def go() -> None:
        sb = make_sandbox(cfg)
        async with sb:
            assert isinstance(sb, BwrapSandbox)
            root, cgroup_dirs = sb.root, list(sb._cgroup.dirs) if sb._cgroup else []
            # it ends without waiting for its daemon (a sleep of about 1000 s, past the 60 s timeout)
            r = await sb.exec(f"setsid sleep {marker} >/dev/null 2>&1 & echo started", timeout_s=60)
            assert r.stdout == "started\n" and not r.timed_out, r
            running = asyncio.ensure_future(sb.exec(f"sleep {marker}; echo never"))
            await asyncio.to_thread(wait_process, f"sleep {marker}")  # running, seen from the host
        result = await running
        assert not result.ok and "never" not in result.stdout
        assert not root.exists() and not any(d.exists() for d in cgroup_dirs)
        assert processes_with(marker) == []
        with pytest.raises(SandboxError, match="closed"):
            await sb.exec("true")
        await sb.close()  # idempotent

    asyncio.run(go())


def test_cancelling_a_command_kills_it(cfg: SandboxConfig) -> None:
    marker = f"{2000 + random.random():.9f}"

    async def go() -> None:
        async with make_sandbox(cfg) as sb:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await sb.exec(f"sleep {marker}")
            assert processes_with(marker) == []
            assert (await sb.exec("echo still fine")).ok

    asyncio.run(go())


def test_a_given_workspace_is_bound_and_kept(cfg: SandboxConfig, scratch: Path) -> None:
    ws = scratch / "mine"
    ws.mkdir()
    (ws / "README").write_text("mine")

    async def go() -> None:
        async with make_sandbox(cfg, workspace=ws) as sb:
            assert sb.workspace == ws
            assert (await sb.exec("cat README && touch made")).stdout == "mine"

    asyncio.run(go())
    assert (ws / "README").read_text() == "mine" and (ws / "made").exists()


def test_uid_containment_runs_as_its_own_user(cfg: SandboxConfig) -> None:
    if os.geteuid() != 0:
        pytest.skip("uid containment needs root")
    uid_cfg = msgspec.structs.replace(cfg, containment="uid")

    async def go() -> None:
        async with make_sandbox(uid_cfg) as sb:
            assert isinstance(sb, BwrapSandbox) and sb.containment == "uid"
            await sb.write_file("d/f.txt", "x")
            r = await sb.exec("id -u; cat d/f.txt; echo y >> d/f.txt; touch /tmp/t; python3 -c 'print(1)'")
            assert r.ok and r.stdout == "0\nx1\n", r
            owner = (sb.workspace / "d/f.txt").stat().st_uid
            assert owner not in (0, os.getuid()) and (sb.workspace / "d").stat().st_uid == owner

    asyncio.run(go())


def test_paths_behind_private_directories_are_still_bound(cfg: SandboxConfig, tmp_path: Path) -> None:
    # pytest's tmp_path lies under a 0700 directory, as /root does: a root driver's sandbox uid cannot search it
    private = msgspec.structs.replace(cfg, workspace_root=str(tmp_path / "sandboxes"))
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "hello").write_text("echo hello from a private dir\n")
    ws = tmp_path / "given"
    ws.mkdir()

    async def go() -> None:
        binds = [(str(tmp_path / "tools"), "/opt/tools", False)]
        async with make_sandbox(private, binds=binds) as sb, make_sandbox(private, workspace=ws) as given:
            r = await sb.exec("sh /opt/tools/hello; echo x > f; cat f; touch /tmp/t; touch /opt/tools/no")
            assert r.stdout == "hello from a private dir\nx\n" and "Read-only" in r.stderr, r
            assert (await given.exec("echo y > made && cat made")).stdout == "y\n"

    asyncio.run(go())


def test_local_backend_keeps_the_api_but_says_it_isolates_nothing(cfg: SandboxConfig) -> None:
    local_cfg = msgspec.structs.replace(cfg, backend="local")

    async def go() -> None:
        async with make_sandbox(local_cfg) as sb:
            assert isinstance(sb, LocalSandbox) and not sb.isolated
            assert str(sb.workspace) == sb.WORKSPACE
            await sb.write_file("f", "local")
            r = await sb.exec("pwd; cat f; echo $HOME")
            assert r.stdout == f"{sb.workspace}\nlocal{sb.workspace}\n"
            slow = await sb.exec("sleep 30", timeout_s=0.5)
            assert slow.timed_out and slow.killed_by == "SIGKILL", slow
            snap = await sb.snapshot()
            await sb.exec("rm f")
            await sb.restore(snap)
            assert await sb.read_file(f"{sb.workspace}/f") == b"local"
            root = sb.root
        assert not root.exists()

    asyncio.run(go())


ZOMBIE_CHECK = """
import asyncio, os, sys
from pathlib import Path
from gyre.config import SandboxConfig
from gyre.sandbox import make_sandbox

def zombies():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
                found.append(pid)
        except OSError:
            pass  # exited meanwhile
    return found

async def main():
    async with make_sandbox(SandboxConfig(workspace_root=sys.argv[1])) as sb:
        await sb.exec("true")
        await sb.exec("sleep 10", timeout_s=0.2)
        await sb.exec("setsid sleep 100 & echo")
        busy = asyncio.ensure_future(sb.exec("sleep 100"))
        await asyncio.sleep(0.2)
    await busy
    await asyncio.sleep(0.2)
    print("zombies", len(zombies()))

asyncio.run(main())
"""


def test_no_zombies_even_where_the_driver_is_the_init(cfg: SandboxConfig) -> None:
    # In a container the driver may be pid 1: every orphan is reparented to it and never reaped.
    cmd = [
        "unshare",
        "--pid",
        "--fork",
        "--mount-proc",
        sys.executable,
        "-c",
        ZOMBIE_CHECK,
        cfg.workspace_root,
    ]
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cannot create a pid namespace here")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "zombies 0", out.stderr


def test_under_uvloop_as_the_driver_runs(cfg: SandboxConfig) -> None:
    uvloop = pytest.importorskip("uvloop")
    modes = ["cgroup", "uid"] if os.geteuid() == 0 else ["rlimit"]

    async def go() -> None:
        for mode in modes:
            async with make_sandbox(msgspec.structs.replace(cfg, containment=mode)) as sb:
                r = await sb.exec("cat; echo $HOME", stdin="in\n")
                assert r.ok and r.stdout == "in\n/workspace\n", (mode, r)
                slow = await sb.exec("sleep 30", timeout_s=0.3)
                assert slow.timed_out and slow.killed_by == "SIGKILL", (mode, slow)

    uvloop.run(go())


def test_network_true_shares_the_hosts_network_explicitly(cfg: SandboxConfig) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=30).close(); print('ok')"

    async def go() -> None:
        async with make_sandbox(msgspec.structs.replace(cfg, network=True)) as sb:
            assert (await sb.exec(["python3", "-c", probe])).stdout == "ok\n"

    try:
        asyncio.run(go())
    finally:
        server.close()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_standard_streams_can_be_reopened_by_path(cfg: SandboxConfig, loop: str) -> None:
    # /dev/stdout is /proc/self/fd/1: reopening it fails on a socket (uvloop's pipes were socket pairs) and on a
    # pipe the sandbox's own uid may not open (the driver's, mode 0600)
    run = pytest.importorskip("uvloop").run if loop == "uvloop" else asyncio.run
    modes = ["cgroup", "uid"] if os.geteuid() == 0 else ["rlimit"]

    async def go() -> None:
        for mode in modes:
            async with make_sandbox(msgspec.structs.replace(cfg, containment=mode)) as sb:
                r = await sb.exec(
                    "echo out > /dev/stdout; echo err > /dev/stderr; cat /dev/stdin", stdin="in"
                )
                assert (r.exit_code, r.stdout, r.stderr) == (0, "out\nin", "err\n"), (mode, r)
                r = await sb.exec("tee /dev/stderr", stdin="both")
                assert (r.stdout, r.stderr) == ("both", "both"), (mode, r)

    run(go())


@pytest.mark.parametrize("server", [True, False], ids=["command-server", "bwrap-per-command"])
def test_sandboxes_run_below_the_drivers_priority(cfg: SandboxConfig, server: bool) -> None:
    """A sandbox that keeps the CPUs busy competes with the driver's loop at ``sandbox.nice`` (5) below it; 0 keeps
    the driver's own priority."""
    own = os.nice(0)

    async def go(nice: int) -> int:
        async with make_sandbox(msgspec.structs.replace(cfg, nice=nice, command_server=server)) as sb:
            r = await sb.exec("nice")  # prints the niceness it runs at
            assert r.ok, r
            return int(r.stdout)

    assert asyncio.run(go(5)) == min(own + 5, 19)
    assert asyncio.run(go(0)) == own

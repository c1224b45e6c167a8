"""Container sandboxes with a real runtime (podman or Docker): commands, limits, clean-up, and a Harbor task that
names an image, run and graded end to end. Skipped, saying why, where no container runtime works (scripts/setup.sh
installs podman with runc and catatonit as root).

No registry is reachable from the test machines, so the image is built here: the host's bash, coreutils and grep
with the libraries they load, imported as a one-layer image (``podman import``).
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gyre.config import SandboxConfig
from gyre.driver.evaluation import EvalOptions, run_eval
from gyre.errors import SandboxError
from gyre.sandbox import WORKSPACE, ContainerSandbox, ExecResult, check_backend, make_sandbox
from gyre.sandbox.container import LABEL, Runtime, client_env, find_runtime
from gyre.sandbox.workspace import SYSTEM_PATH
from gyre.tasks.formats import load_task
from gyre.tasks.verify import Verifier

pytestmark = pytest.mark.slow(reason="starts podman containers")

TOOLS = (
    "bash", "sh", "env", "cat", "echo", "ls", "sleep", "id", "mkdir", "touch", "head", "tail", "tr", "rm", "wc",
    "printf", "true", "pwd", "hostname", "grep", "stat", "dd", "ln", "chmod", "seq",
)  # fmt: skip


def _add(tar: tarfile.TarFile, path: str, seen: set[str]) -> None:
    """Add ``path`` as the host has it: each symlink on the way as a symlink, then the file it leads to."""
    parts = Path(path).parts[1:]
    for i in range(1, len(parts) + 1):
        prefix = "/" + "/".join(parts[:i])
        if os.path.islink(prefix):
            if prefix not in seen:
                seen.add(prefix)
                info = tarfile.TarInfo(prefix.lstrip("/"))
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(prefix)
                tar.addfile(info)
            target = os.path.normpath(os.path.join(os.path.dirname(prefix), os.readlink(prefix)))
            return _add(tar, os.path.join(target, *parts[i:]), seen)
    if path not in seen:
        seen.add(path)
        tar.add(path, arcname=path.lstrip("/"), recursive=False)


def build_rootfs() -> bytes:
    """A tarball of the host's TOOLS, the libraries they load and a minimal /etc."""
    buf = io.BytesIO()
    seen: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for tool in TOOLS:
            path = shutil.which(tool, path=SYSTEM_PATH)
            assert path is not None, tool
            _add(tar, path, seen)
            ldd = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
            for lib in {w for w in ldd.split() if w.startswith("/")}:
                _add(tar, lib, seen)
        for name, text in (("etc/passwd", "root:x:0:0:root:/root:/bin/bash\n"), ("etc/group", "root:x:0:\n")):
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text.encode()))
    return buf.getvalue()


@pytest.fixture(scope="session")
def runtime() -> Runtime:
    try:
        return find_runtime("auto")
    except SandboxError as exc:
        pytest.skip(f"no container runtime works here: {exc}")


@pytest.fixture(scope="session")
def image(runtime: Runtime) -> Iterator[str]:
    """A local image of the host's tools (removed after the session)."""
    name = f"localhost/gyre-test-tools:{os.getpid()}"
    with tempfile.NamedTemporaryFile(suffix=".tar") as f:
        f.write(build_rootfs())
        f.flush()
        out = subprocess.run(
            runtime.cli("import", f.name, name), capture_output=True, text=True, env=client_env()
        )
    if out.returncode != 0:
        pytest.skip(f"{runtime.name} cannot import an image here: {out.stderr.strip()}")
    try:
        check_backend(SandboxConfig(image=name))  # runs one container: skip where none can run at all
    except SandboxError as exc:
        subprocess.run(runtime.cli("rmi", "-f", name), capture_output=True, env=client_env())
        pytest.skip(f"{runtime.name} cannot run containers here: {exc}")
    yield name
    subprocess.run(runtime.cli("rmi", "-f", name), capture_output=True, env=client_env())


@pytest.fixture
def ccfg(image: str, tmp_path: Path) -> SandboxConfig:
    """Limits small enough to hit quickly; workspaces under this test's own directory."""
    root = tmp_path / "sandboxes"
    root.mkdir()
    return SandboxConfig(
        image=image, workspace_root=str(root), memory_mib=128, max_processes=64, default_timeout_s=30
    )


def containers_of(runtime: Runtime, sandbox_id: str) -> list[str]:
    out = subprocess.run(
        runtime.cli("ps", "-a", "-q", "--filter", f"label={LABEL}={sandbox_id}"),
        capture_output=True, text=True, env=client_env(), check=True,
    )  # fmt: skip
    return out.stdout.split()


def test_commands_run_in_the_image_over_the_workspace(ccfg: SandboxConfig) -> None:
    async def go() -> None:
        async with make_sandbox(ccfg) as sb:
            assert isinstance(sb, ContainerSandbox) and sb.isolated and sb.WORKSPACE == WORKSPACE
            await sb.write_file("in.txt", "from the host\n")
            r = await sb.exec("cat in.txt; pwd; hostname; ls /usr/bin | wc -l; echo out > made.txt")
            lines = r.stdout.splitlines()
            assert r.ok and lines[:3] == ["from the host", WORKSPACE, "gyre"], r
            assert int(lines[3]) < 100  # the image's few tools, not the host's system
            assert await sb.read_file("made.txt") == b"out\n"
            r = await sb.exec(["sh", "-c", 'echo "$0 $1" >&2; exit 3', "a", "b c"])
            assert (r.exit_code, r.stdout, r.stderr) == (3, "", "a b c\n")
            assert (await sb.exec("pwd", cwd="sub")).stdout == "/workspace/sub\n"
            assert (await sb.exec("wc -c", stdin=b"x" * 100_000)).stdout.strip() == "100000"
            r = await sb.exec("env", env={"MY_VAR": "x y"})
            env = dict(line.split("=", 1) for line in r.stdout.splitlines())
            assert env["MY_VAR"] == "x y" and env["HOME"] == WORKSPACE and "GYRE" not in r.stdout
            r = await sb.exec("touch /usr/x; echo tmp > /tmp/t")
            assert "Read-only file system" in r.stderr
            assert (await sb.exec("cat /tmp/t")).stdout == "tmp\n"  # /tmp lasts between commands
            snap = await sb.snapshot()
            await sb.exec("rm made.txt; echo new > new.txt")
            await sb.restore(snap)
            assert (await sb.exec("ls")).stdout.split() == ["in.txt", "made.txt", "sub"]

    asyncio.run(go())


def test_no_network_no_privilege_and_host_files_unseen(ccfg: SandboxConfig) -> None:
    async def go() -> None:
        async with make_sandbox(ccfg) as sb:
            r = await sb.exec("ls /sys/class/net; exec 3<>/dev/tcp/1.1.1.1/53 && echo connected")
            assert r.stdout.split() == ["lo"] and "connected" not in r.stdout, r
            r = await sb.exec("grep -E 'Cap(Eff|Prm)|NoNewPrivs' /proc/self/status")
            assert r.stdout.split() == ["CapPrm:", "0000000000000000", "CapEff:", "0000000000000000",
                                        "NoNewPrivs:", "1"], r  # fmt: skip
            host_uid = os.stat(sb.workspace).st_uid
            if os.geteuid() == 0:  # the container's root is an unprivileged host uid of the sandbox's own
                assert host_uid >= 100_000_000
                r = await sb.exec("echo x > owned; id -u")
                assert r.stdout == "0\n" and os.stat(sb.workspace / "owned").st_uid == host_uid
            r = await sb.exec(f"ls {Path(__file__).parent}")
            assert r.exit_code != 0

    asyncio.run(go())


def test_limits_hold_and_a_timeout_removes_the_container(ccfg: SandboxConfig, runtime: Runtime) -> None:
    async def go() -> None:
        async with make_sandbox(ccfg) as sb:
            r = await sb.exec("x=$(head -c 400000000 /dev/zero | tr '\\0' a); echo survived ${#x}")
            assert r.killed_by == "SIGKILL" and "survived" not in r.stdout, r  # 128 MiB of memory
            r = await sb.exec("for i in $(seq 200); do sleep 5 & done; wait", timeout_s=20)
            assert r.exit_code != 0 and "fork" in r.stderr, r  # 64 processes
            r = await sb.exec("ulimit -n; ulimit -c")
            assert r.stdout.split() == [str(ccfg.open_files), "0"]
            r = await sb.exec("sleep 60 & sleep 60", timeout_s=1.5)
            assert r.timed_out and r.killed_by == "SIGKILL", r
            assert containers_of(runtime, sb.id) == []  # the command's container is gone, its daemon too

    asyncio.run(go())


def test_close_and_cancellation_remove_every_container(ccfg: SandboxConfig, runtime: Runtime) -> None:
    async def started(sb: ContainerSandbox, name: str) -> asyncio.Task[ExecResult]:
        """A long command, once its container runs (it writes to a FIFO the host reads)."""
        os.mkfifo(sb.workspace / name)
        os.chmod(sb.workspace / name, 0o666)
        task = asyncio.create_task(sb.exec(f"echo up > {name}; sleep 60"))
        assert await asyncio.to_thread((sb.workspace / name).read_text) == "up\n"
        return task

    async def go() -> None:
        async with make_sandbox(ccfg) as sb:
            assert isinstance(sb, ContainerSandbox)
            running = await started(sb, "first")
            assert len(containers_of(runtime, sb.id)) == 1
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
            assert containers_of(runtime, sb.id) == []
            left = await started(sb, "second")
        assert containers_of(runtime, sb.id) == []
        assert (await left).exit_code != 0

    asyncio.run(go())


def test_a_missing_image_is_refused_with_what_to_do(tmp_path: Path, runtime: Runtime) -> None:
    with pytest.raises(SandboxError, match="pull"):
        make_sandbox(SandboxConfig(image="localhost/gyre-no-such-image:1", workspace_root=str(tmp_path)))


def write_harbor_task(root: Path, image: str) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "solution").mkdir()
    (root / "instruction.md").write_text("Write hello.txt saying hello.\n")
    (root / "task.toml").write_text(
        f'version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n[environment]\ndocker_image = "{image}"\n'
    )
    (root / "tests" / "test.sh").write_text(
        "mkdir -p /logs/verifier\n"
        'if grep -qx hello hello.txt 2>/dev/null && [ "$(hostname)" = gyre ] && ! [ -e /usr/bin/python3 ];'
        " then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    (root / "solution" / "solve.sh").write_text("echo hello > hello.txt\n")
    return root


def test_a_harbor_task_naming_an_image_runs_and_is_graded_in_it(ccfg: SandboxConfig, tmp_path: Path) -> None:
    task = load_task(write_harbor_task(tmp_path / "hello", ccfg.image))
    assert task.image == ccfg.image and task.unsupported is None
    missing = load_task(write_harbor_task(tmp_path / "other", "localhost/gyre-no-such-image:1"))
    assert missing.unsupported is not None and "pull" in missing.unsupported
    host = SandboxConfig(workspace_root=ccfg.workspace_root)  # the driver names no image: the task does
    verifier = Verifier(host, retry_delay_s=0.01)

    async def go() -> tuple[float, float]:
        scores = []
        for solve in (True, False):
            work = tmp_path / f"work-{solve}"
            work.mkdir()
            async with make_sandbox(ccfg, workspace=work) as sb:  # as the runtime runs the oracle in it
                for path, text in {**task.files, **(task.solution_files if solve else {})}.items():
                    await sb.write_file(path, text)
                if solve and task.solution_command:
                    assert (await sb.exec(task.solution_command)).ok
            verdict = await verifier.verify(task, work)
            assert verdict.outcome == "scored", verdict
            scores.append(verdict.score)
        return scores[0], scores[1]

    assert asyncio.run(go()) == (1.0, 0.0)


def test_eval_runs_a_harbor_image_task_and_lists_one_whose_image_is_absent(
    ccfg: SandboxConfig, tmp_path: Path, tiny_model: Path
) -> None:
    suite = tmp_path / "suite"
    write_harbor_task(suite / "hello", ccfg.image)
    write_harbor_task(suite / "absent", "localhost/gyre-no-such-image:1")
    options = EvalOptions(
        suite=str(suite),
        run_dir=str(tmp_path / "run"),
        model_path=str(tiny_model),
        progress=False,
        agent="oracle",
    )
    summary = run_eval(options)  # the oracle runs solve.sh in the image, the verifier test.sh
    assert [r.task_id for r in summary.rows] == ["hello"] and summary.rows[0].score == 1.0, summary.rows
    assert "pull" in summary.unsupported["absent"]

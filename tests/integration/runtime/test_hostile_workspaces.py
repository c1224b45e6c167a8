"""Executions whose sandboxes attack the runtime (issue 14): each must end only itself, and reach only its session."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes import ScriptedEngine
from gyre.config import RouterConfig, SandboxConfig
from gyre.engine.models import load_tokenizer
from gyre.router.routing import Router
from gyre.runtime import CommandAgentSpec, ExecutionResult, ExecutionSpec, Runtime, dispatch
from gyre.runtime.dispatch import RuntimeStatistics
from gyre.sandbox import filetree
from gyre.tasks import Task
from gyre.tasks.task import VerifierSpec
from gyre.tasks.verify import Verifier


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    return load_tokenizer(tiny_model)


@pytest.fixture
def tmp_dir() -> Iterator[Path]:
    """A workspace root that sandboxes running as their own uid can reach (pytest's tmp_path is private)."""
    tmp = Path(tempfile.mkdtemp(prefix="gyre-test-"))
    tmp.chmod(0o711)
    try:
        yield tmp
    finally:
        filetree.remove(tmp)  # iterative: whatever a failed test left, however deep


def run(
    tiny_model: Path,
    tokenizer: Any,
    specs: Callable[[Router], list[ExecutionSpec]],
    sandbox: SandboxConfig,
    after: Callable[[], None] = lambda: None,
) -> tuple[list[ExecutionResult], RuntimeStatistics]:
    """Run the specs ``specs(router)`` makes; ``after`` runs once they are done, before the runtime closes."""

    async def go(url: str) -> tuple[list[ExecutionResult], RuntimeStatistics]:
        router = Router(RouterConfig(model_path=str(tiny_model), engines=[url]))
        runtime = Runtime(router, sandbox, verifier=Verifier(sandbox, retries=0, python_env=False))
        try:
            results = await runtime.run(specs(router))
            after()
            return results, runtime.statistics()
        finally:
            await runtime.aclose()
            await router.aclose()

    with ScriptedEngine(tokenizer, lambda ids: "hello from the model") as fake:
        return asyncio.run(go(fake.url))


def command(task_id: str, script: str, check: str = "true", **env: str) -> ExecutionSpec:
    """A command agent running the bash ``script``, its task scored by the exit code of ``check``."""
    task = Task(id=task_id, instruction="attack", verifier=VerifierSpec(commands=(check,)))
    agent = CommandAgentSpec(argv=["bash", "-c", script], env=env, python_env=False)
    return ExecutionSpec(task=task, agent=agent)


def left_behind(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_a_deeply_nested_workspace_ends_only_its_own_execution(
    tiny_model: Path, tokenizer: Any, tmp_dir: Path
) -> None:
    """1,300 nested directories once raised RecursionError out of the verifier's walk and the clean-up's rmtree,
    which cancelled every other execution and left their directories behind; 2,100 (paths past PATH_MAX) ended it
    as ``dropped``, never trained (issue 31): it is the agent's 0."""
    deep_path = "/".join(["d"] * 2100)
    deep = command(
        "deep", f"mkdir -p {deep_path} && echo bottom > {deep_path}/leaf", check="false"
    )  # failing
    neighbours = [command(f"n{i}", "sleep 2; echo ok > out.txt", check="test -f out.txt") for i in range(2)]
    root = tmp_dir / "ws"
    results, stats = run(
        tiny_model, tokenizer, lambda _: [deep, *neighbours], SandboxConfig(workspace_root=str(root))
    )
    by_task = {r.task_id: r for r in results}
    deep_verdict = by_task["deep"].verdict
    assert deep_verdict is not None and by_task["deep"].status != "cancelled"
    assert by_task["deep"].trainable and deep_verdict.score == 0.0, (deep_verdict, by_task["deep"].error)
    for r in results[1:]:
        assert r.status == "done" and r.verdict is not None and r.verdict.score == 1.0, (r.error, r.verdict)
    assert stats.finished == 3
    assert not [n for n in left_behind(root) if n.startswith(("gyre-execution-", "gyre-sandbox-"))]


def test_a_workspace_over_its_quota_stops_that_execution_only(
    tiny_model: Path, tokenizer: Any, tmp_dir: Path
) -> None:
    """Past its disk quota while it runs (checked every quota_check_s), or past its inode quota when it ends, an
    execution is ``resource_exceeded`` and scores 0, trained on (issue 31: it was dropped, so a failing policy
    learnt that breaking its sandbox is safer than failing); its neighbour is scored as usual."""
    cfg = SandboxConfig(
        workspace_root=str(tmp_dir / "ws"), disk_quota_mib=4, max_inodes=300, quota_check_s=0.2
    )
    specs = [
        command("disk", "head -c 12M /dev/zero > big && sleep 60"),  # stopped long before its sleep ends
        command(
            "inodes", "mkdir many && cd many && touch $(seq 500)"
        ),  # exits at once: the last check sees it
        command("fine", "head -c 1M /dev/zero > small && mkdir a && touch a/b", check="test -f a/b"),
        # 2.7 GB of sparse files use no disk: within the quota, graded as usual (they were counted by size)
        command("sparse", "truncate -s 900M a b c && sleep 1", check="test -f c"),
    ]
    results, stats = run(tiny_model, tokenizer, lambda _: specs, cfg)
    disk, inodes, fine, sparse = results
    assert disk.status == "resource_exceeded" and "disk_quota_mib" in (disk.error or ""), disk.error
    # stopped while it ran, by the quota's watch (the check at its end says the same, but after its `sleep 60`)
    assert disk.agent is None
    assert inodes.status == "resource_exceeded" and "max_inodes" in (inodes.error or ""), inodes.error
    for over in (disk, inodes):
        assert over.verdict is not None and (over.verdict.outcome, over.verdict.score) == ("scored", 0.0)
        assert over.trainable and "the agent's own doing" in over.verdict.detail
    for done in (fine, sparse):
        assert done.status == "done" and done.verdict is not None and done.verdict.score == 1.0, done.error
    assert stats.by_status == {"resource_exceeded": 2, "done": 2}
    assert left_behind(tmp_dir / "ws") == []


def test_set_id_bits_never_leave_a_workspace(tiny_model: Path, tokenizer: Any, tmp_dir: Path) -> None:
    """A set-uid file an agent made reaches the verifier (and the host) without its set-id bits. Bubblewrap here
    refuses set-id bits already; the local backend runs commands as the driver: its set-uid file is set-uid root."""
    spec = command(
        "setuid",
        "cp /bin/true su && chmod u+s,g+s su && mkdir d && chmod g+s d",
        check="test ! -u su -a ! -g su",
    )
    cfg = SandboxConfig(workspace_root=str(tmp_dir / "ws"), backend="local")
    (result,), _ = run(tiny_model, tokenizer, lambda _: [spec], cfg)
    assert result.status == "done", result.error
    assert result.verdict is not None and result.verdict.score == 1.0, result.verdict


# Run inside the sandbox with the system python3: tries to take over the shared socket, then to use a stolen token.
ATTACK = r"""
import json, os, sys, urllib.request, urllib.error, glob
out = {}
for name, attempt in [("rename", lambda: os.rename("/run/gyre/router.sock", "/run/gyre/mine")),
                      ("create", lambda: open("/run/gyre/evil.sock", "w"))]:
    try:
        attempt()
        out[name] = "succeeded"
    except OSError:
        out[name] = "refused"
out["listing"] = sorted(os.listdir("/run/gyre"))
out["others"] = glob.glob("/tmp/gyre-router-*")
def status(path, token=None):
    headers = {"authorization": "Bearer " + token} if token else {}
    try:
        return urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:8000" + path, headers=headers)).status
    except urllib.error.HTTPError as exc:
        return exc.code
own, stolen = os.environ["OPENAI_API_KEY"], os.environ["STOLEN"]
out["own"] = status(f"/s/{own}/v1/models")
out["stolen_path"] = status(f"/s/{stolen}/v1/models")
out["stolen_bearer"] = status("/v1/models", stolen)
out["stolen_records"] = status(f"/s/{stolen}/v1/gyre/records")
print("RESULT " + json.dumps(out))
"""


def test_a_command_agent_reaches_only_its_own_session(
    tiny_model: Path, tokenizer: Any, tmp_dir: Path
) -> None:
    """The router socket used to be one writable directory shared by every sandbox: one could replace it and read
    others' tokens, and any live token worked from any sandbox. Now each execution has its own read-only socket
    that serves its own session only."""
    stolen: list[str] = []

    def specs(router: Router) -> list[ExecutionSpec]:
        stolen.append(router.open_session("victim"))  # a live session of another execution
        attack = Task(id="attack", instruction="attack", files={"attack.py": ATTACK})
        agent = CommandAgentSpec(argv=["python3", "attack.py"], env={"STOLEN": stolen[0]}, python_env=False)
        return [ExecutionSpec(task=attack, agent=agent), command("victim", "sleep 1")]

    results, _ = run(tiny_model, tokenizer, specs, SandboxConfig(workspace_root=str(tmp_dir / "ws")))
    attack, victim = results
    assert attack.agent is not None and victim.status == "done", (attack.error, victim.error)
    line = next(x for x in attack.agent.detail.splitlines() if x.startswith("RESULT "))
    seen = json.loads(line.removeprefix("RESULT "))
    assert seen["rename"] == seen["create"] == "refused"
    assert seen["listing"] == ["router.sock"] and seen["others"] == []
    assert seen["own"] == 200
    assert seen["stolen_path"] == seen["stolen_bearer"] == seen["stolen_records"] == 401


def test_concurrent_command_agents_leave_no_socket_directories(
    tiny_model: Path, tokenizer: Any, tmp_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Command agents starting together each get their own socket directory, and it goes with its execution."""
    sockets: list[str] = []
    make_sandbox = dispatch.make_sandbox

    def recording(cfg: SandboxConfig, workspace: Path | None = None, binds: Any = (), **kwargs: Any) -> Any:
        sockets.extend(host for host, inside, _ in binds if inside == "/run/gyre")
        return make_sandbox(cfg, workspace=workspace, binds=binds, **kwargs)

    monkeypatch.setattr(dispatch, "make_sandbox", recording)
    specs = [command(f"c{i}", "test -S /run/gyre/router.sock", check="true") for i in range(4)]
    left: list[str] = []

    def after() -> None:  # the executions are over, the runtime not yet closed
        left.extend(s for s in sockets if Path(s).exists())

    cfg = SandboxConfig(workspace_root=str(tmp_dir / "ws"))
    results, _ = run(tiny_model, tokenizer, lambda _: specs, cfg, after)
    for r in results:
        assert r.status == "done" and r.agent is not None and r.agent.status == "finished", r.agent
    assert len(set(sockets)) == 4  # one each
    assert left == []


FLOOD = """
import socket, time
held = []
for _ in range(3000):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("/run/gyre/router.sock")
    except OSError:
        s.close()
        continue
    held.append(s)
time.sleep(4)
"""


def test_a_sandbox_flooding_its_router_socket_cannot_take_the_drivers_descriptors(
    tiny_model: Path, tokenizer: Any, tmp_dir: Path
) -> None:
    """Before issue 31 each connection to an execution's socket held one of the driver's descriptors: ~16,000 of them
    took the driver to its limit and its neighbours crashed (then trained on as placeholders). Now a socket holds
    at most `MAX_CONNECTIONS`; the others are closed as they are accepted."""
    import os
    import threading

    from gyre.runtime.sockets import MAX_CONNECTIONS

    baseline = len(os.listdir("/proc/self/fd"))
    peak, running = [baseline], threading.Event()

    def sample() -> None:
        while not running.is_set():
            peak.append(len(os.listdir("/proc/self/fd")))
            running.wait(0.05)

    watcher = threading.Thread(target=sample)
    watcher.start()
    specs = [command("flood", f"python3 -c '{FLOOD}'"),
             *(command(f"n{i}", "sleep 2; echo ok > out.txt", check="test -f out.txt") for i in range(2))]  # fmt: skip
    try:
        results, _ = run(
            tiny_model, tokenizer, lambda _: specs, SandboxConfig(workspace_root=str(tmp_dir / "ws"))
        )
    finally:
        running.set()
        watcher.join()
    for r in results[1:]:
        assert r.status == "done" and r.verdict is not None and r.verdict.score == 1.0, (r.error, r.verdict)
    held = (
        sorted(peak)[len(peak) * 9 // 10] - baseline
    )  # while the flood holds its connections (4 s of the run)
    # was ~3,000; besides the 64 held, connections refused but not yet closed (one loop turn each: more of them on
    # a loaded machine: 171 seen in a full run of the fast tier, 316 with two full suites sharing the 2 cores)
    assert held < 8 * MAX_CONNECTIONS, (held, max(peak) - baseline)
    assert max(peak) - baseline < 1000, (
        max(peak) - baseline
    )  # refused connections are closed one loop turn later

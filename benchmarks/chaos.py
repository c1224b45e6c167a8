"""Chaos on the real CPU stack (issue 17): faults injected into a live ``gyre train``, and what the run left behind.

Each scenario starts ``gyre train`` (embedded engines in cell processes, the router, the runtime with bubblewrap
sandboxes, the torch trainer) on the toy suite with a tiny model, injects one fault from outside at a moment it
observes in the run directory, and then measures, from the run directory alone:

- executions lost: execution indices of the steps the run reached (applied or in progress) with no line in
  ``journal/executions.jsonl``;
- agent-visible errors: journaled executions that did not end ``done`` without an error, less the one execution a
  sandbox fault was aimed at (that one must end ``resource_exceeded``: reported in the outcome);
- records not token-exact: journaled call records whose behaviour logprobs teacher forcing does not reproduce
  (atol 1e-4) at each token's weight version (the checkpoints of the run; version 0 is the model it started from);
- micro-steps trained twice / never, at the grain the run directory records (``metrics.jsonl``): executions named
  by more than one applied step, trainable executions of applied steps named by none, and steps whose members'
  accepted micro-steps (``by_member``) do not add up to the step's micro-steps;
- recovery time, per scenario (its ``recovery`` column says from what to what).

The ``switches`` scenario drives role switches of real cells directly (the controller, no trainer steps) under
live agents on the official ``openai`` client over HTTP; its errors are what the clients raised.

    python benchmarks/chaos.py                     # every scenario, 40 switches under 200 agents (~30 min on 2 busy cores)
    python benchmarks/chaos.py --scenarios kill-serving,control --switches 1000 --agents 200
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from gyre.driver.training import Resume, StepRecord, execution_index
from gyre.journal import read_journal
from gyre.journal.records import CallRecord, expand_inputs
from gyre.protocol import SwitchRecord
from gyre.runtime.dispatch import ExecutionResult

console = Console(width=180)
PY = sys.executable
RESULTS = Path(__file__).parent / "results"
STEPS, TASKS, GROUP = 2, 2, 2
BATCH = TASKS * GROUP
RUN_TIMEOUT_S = 240.0
BASE = f"""
[run]
suite = "toy:8"
steps = {STEPS}
tasks_per_step = {TASKS}
group_size = {GROUP}
agent_max_calls = 3
agent_max_tokens = 16

[cells]
count = 2
capacity_executions = 2
engine_overrides = ["engine.kv_cache_mem_gib=0.2"]
num_threads = 1

[trainer]
learning_rate = 1e-4
heartbeat_s = 0.25
member_timeout_s = 2.0

[controller]
heartbeat_s = 0.25
cell_timeout_s = 2.0
"""


@dataclass
class Row:
    """One line of the table."""

    scenario: str
    lost: int | str = "n/m"
    errors: int | str = "n/m"
    not_exact: int | str = "n/m"
    twice: int | str = "n/m"
    never: int | str = "n/m"
    recovery_s: float | str = "n/m"
    recovery: str = ""
    outcome: str = ""
    notes: list[str] = field(default_factory=list)


# ---- gyre train, from outside ---------------------------------------------------------------------------------------
class TrainRun:
    """One ``gyre train`` process (its own session: the driver, its cells and their sandboxes) on a run dir."""

    def __init__(self, root: Path, model: Path, overrides: list[str], mode: str = "elastic") -> None:
        self.root, self.model, self.mode = root, model, mode
        self.run_dir = root / "run"
        root.mkdir(parents=True, exist_ok=True)
        (root / "run.toml").write_text(BASE)
        self.overrides = [f'trainer.bind="tcp://127.0.0.1:{_free_port()}"', *overrides]
        self.proc: subprocess.Popen[bytes] | None = None
        self.exit_codes: list[int | None] = []

    def start(self, resume: bool = False) -> None:
        if resume:
            argv = [PY, "-m", "gyre", "train", "--resume", str(self.run_dir), "--no-live"]
        else:
            argv = [PY, "-m", "gyre", "train", str(self.root / "run.toml"), "--mode", self.mode, "--model",
                    str(self.model), "--run-dir", str(self.run_dir), "--no-live"]  # fmt: skip
            for o in self.overrides:
                argv += ["--set", o]
        out = open(self.root / f"driver-{len(self.exit_codes)}.log", "wb")  # noqa: SIM115 (the child's)
        self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()

    async def wait(self, timeout_s: float = RUN_TIMEOUT_S) -> int | None:
        """The driver's exit code; None when it ran past ``timeout_s`` (then its whole session is killed)."""
        assert self.proc is not None
        try:
            code: int | None = await asyncio.to_thread(self.proc.wait, timeout_s)
        except subprocess.TimeoutExpired:
            code = None
            self.kill_all()
        self.exit_codes.append(code)
        return code

    def kill_all(self) -> None:
        """SIGKILL the driver's whole session (driver, cells, sandboxes): its machine died."""
        assert self.proc is not None
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
        self.proc.wait()

    def cell_pid(self, name: str) -> int | None:
        """The pid of cell ``name`` of this run (a ``gyre cell`` process whose config lies in the run dir)."""
        config = str(self.run_dir / "config.toml")
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            words = [a.decode(errors="replace") for a in argv]
            if "cell" in words and config in words and name in words:
                return int(entry.name)
        return None

    def engine_pid(self, name: str) -> int | None:
        """The pid of cell ``name``'s engine process (a ``gyre serve-engine`` child of the cell)."""
        cell = self.cell_pid(name)
        for entry in Path("/proc").iterdir():
            if cell is None or not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue
            if ppid == cell and b"serve-engine" in argv:
                return int(entry.name)
        return None

    # what the run left behind
    def lines(self, name: str) -> int:
        path = self.run_dir / name
        return path.read_bytes().count(b"\n") if path.exists() else 0

    def steps(self) -> list[StepRecord]:
        path = self.run_dir / "metrics.jsonl"
        return list(read_journal(path, StepRecord)) if path.exists() else []

    def executions(self) -> list[ExecutionResult]:
        path = self.run_dir / "journal" / "executions.jsonl"
        return list(read_journal(path, ExecutionResult)) if path.exists() else []

    def switches(self) -> list[SwitchRecord]:
        path = self.run_dir / "switches.jsonl"
        return list(read_journal(path, SwitchRecord)) if path.exists() else []


def _free_port() -> int:
    from gyre.engine.launcher import free_port

    return free_port()


async def wait_for(what: str, condition: Callable[[], bool], run: TrainRun, timeout_s: float = 180.0) -> None:
    """Until ``condition``; an error naming ``what`` if the driver exits or the time runs out first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if run.proc is not None and run.proc.poll() is not None:
            raise RuntimeError(f"the run ended before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


# ---- measuring ------------------------------------------------------------------------------------------------------
class TokenExactness:
    """Teacher forcing of journaled records at their tokens' weight versions (models loaded once per version)."""

    def __init__(self, model: Path) -> None:
        self.model = model
        self._models: dict[tuple[str, int], Any] = {}

    def _load(self, run_dir: Path, version: int) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        key = (str(run_dir), version)
        if key not in self._models:
            path = self.model if version == 0 else run_dir / "checkpoints" / f"step-{version}"
            if not (path / "config.json").exists():
                self._models[key] = None
            else:
                self._models[key] = AutoModelForCausalLM.from_pretrained(
                    path, local_files_only=True, dtype=torch.float32
                ).eval()
        return self._models[key]

    def count(
        self, run_dir: Path, sessions: list[list[CallRecord]], temperature: float = 1.0
    ) -> tuple[int, int]:
        """(records checked, records not token-exact or at a version with no checkpoint to check against)."""
        import torch

        checked = bad = 0
        for records in sessions:
            full = expand_inputs(records)
            for record in records:
                if not record.output_ids:
                    continue
                checked += 1
                versions = record.token_versions()
                want = torch.zeros(len(record.output_ids))
                ok = True
                for version in set(versions):
                    model = self._load(run_dir, version)
                    if model is None:
                        ok = False
                        break
                    prompt = full[record.call_id]
                    n = len(record.output_ids)
                    with torch.no_grad():  # the logits of the output positions only (the vocabulary is large)
                        logits = model(
                            torch.tensor([prompt + record.output_ids]), logits_to_keep=n + 1
                        ).logits
                    lp = torch.log_softmax(logits[0, :-1].float() / temperature, dim=-1)
                    ref = lp[torch.arange(n), torch.tensor(record.output_ids)]
                    mask = torch.tensor([v == version for v in versions])
                    want[mask] = ref[mask]
                got = torch.tensor(record.output_logprobs)
                if not ok or not torch.allclose(got, want, atol=1e-4):
                    bad += 1
        self._models = {
            k: v for k, v in self._models.items() if k[0] != str(run_dir)
        }  # free the run's models
        return checked, bad


def measure(run: TrainRun, exact: TokenExactness, row: Row, targeted: int = 0) -> list[ExecutionResult]:
    """Fill ``row``'s counts from the run directory; ``targeted``: executions a sandbox fault was aimed at."""
    steps, results = run.steps(), run.executions()
    applied = {s.step for s in steps}
    reached = min(max(applied, default=-1) + 1, STEPS - 1)  # the step in progress (or the last one)
    latest: dict[int, ExecutionResult] = {}
    for r in results:  # a resumed run's repeat of an index replaces the first attempt
        if (index := execution_index(r.execution_id)) is not None:
            latest[index] = r
    row.lost = sum(i not in latest for i in range((reached + 1) * BATCH))
    failed = [r for r in latest.values() if r.status != "done" or r.error]
    row.errors = max(len(failed) - targeted, 0)
    named = Counter(e for s in steps for e in s.execution_ids)
    trainable = {r.execution_id for i, r in latest.items() if i // BATCH in applied and r.trainable}
    accounting = [s.trainer.micro_steps - sum(s.trainer.by_member.values()) for s in steps]
    row.twice = sum(n > 1 for n in named.values()) + sum(-d for d in accounting if d < 0)
    row.never = len(trainable - set(named)) + sum(d for d in accounting if d > 0)
    checked, bad = exact.count(run.run_dir, [r.records for r in latest.values()])
    row.not_exact = bad
    row.notes.append(
        f"{len(applied)}/{STEPS} steps applied, {len(latest)} executions, {checked} records checked"
    )
    return list(latest.values())


def finished_calls(run: TrainRun) -> list[CallRecord]:
    path = run.run_dir / "journal" / "calls.jsonl"
    return list(read_journal(path, CallRecord)) if path.exists() else []


def outcome(run: TrainRun) -> str:
    codes = run.exit_codes
    if all(c == 0 for c in codes):
        return "run completes" if len(codes) == 1 else f"run completes after {len(codes) - 1} resume(s)"
    return "run fails (" + ", ".join("timed out" if c is None else f"exit {c}" for c in codes) + ")"


# ---- scenarios on gyre train ----------------------------------------------------------------------------------------
Scenario = Callable[[Path, Path, TokenExactness], Awaitable[Row]]


async def baseline(root: Path, model: Path, exact: TokenExactness) -> Row:
    run, row = TrainRun(root, model, []), Row("baseline (no fault)", recovery_s="-", recovery="-")
    run.start()
    await run.wait()
    measure(run, exact, row)
    row.outcome = outcome(run)
    return row


async def _kill_serving(root: Path, model: Path, exact: TokenExactness, hang: bool) -> Row:
    """The standalone serving cell (serve-0) killed (SIGKILL), or its engine process hung (SIGSTOP: its sockets stay
    open, nothing answers, the cell goes on beating), once calls are journaled; recovery: the fault -> the last call that was in flight at the fault answered."""
    name = "hang-engine" if hang else "kill-serving"
    row = Row(name, recovery="fault -> in-flight calls answered")
    # a hung engine also misses the core's weight pushes: each waits at most transfer_timeout_s, then it is detached
    run = TrainRun(root, model, ["cells.standalone=1", *(["trainer.transfer_timeout_s=10"] if hang else [])])
    run.start()
    try:
        await wait_for("calls journaled", lambda: run.lines("journal/calls.jsonl") >= 4, run)
        pid = run.engine_pid("serve-0") if hang else run.cell_pid("serve-0")
        assert pid is not None, "serve-0 (or its engine) not found"
        at = time.time()
        os.kill(pid, signal.SIGSTOP if hang else signal.SIGKILL)
        row.notes.append(f"{'serve-0 engine stopped (the cell beats on)' if hang else 'serve-0 killed'} after "
                         f"{run.lines('journal/calls.jsonl')} calls journaled")  # fmt: skip
    except (RuntimeError, AssertionError) as exc:
        row.notes.append(f"fault not injected: {exc}")
        at = None
    await run.wait(RUN_TIMEOUT_S)
    measure(run, exact, row)
    row.outcome = outcome(run)
    if at is not None:
        calls = finished_calls(run)
        spanning = [c.timing.finished_s for c in calls if c.timing.submitted_s < at < c.timing.finished_s]
        moved = [c for c in calls if c.timing.submitted_s < at < c.timing.finished_s and c.cell != "serve-0"]
        row.recovery_s = round(max(spanning) - at, 2) if spanning else "-"
        row.notes.append(
            f"{len(spanning)} calls were in flight at the fault, {len(moved)} answered by another cell"
        )
    core_log = run.run_dir / "logs" / "cell-0.log"
    if hang and core_log.exists():  # the core's side: pushes to the stopped engine
        detached = [line.split("detached: ", 1)[1] for line in core_log.read_text().splitlines()
                    if " detached: " in line]  # fmt: skip
        row.notes.append(
            f"the core detached the engine {len(detached)}x" + (f" ({detached[0]})" if detached else "")
        )
    return row


async def kill_serving(root: Path, model: Path, exact: TokenExactness) -> Row:
    return await _kill_serving(root, model, exact, hang=False)


async def hang_engine(root: Path, model: Path, exact: TokenExactness) -> Row:
    return await _kill_serving(root, model, exact, hang=True)


async def _kill_training(root: Path, model: Path, exact: TokenExactness, cell: str) -> Row:
    """``cell`` killed right after its serve -> train switch of step 1 (colocate: every cell trains every step);
    recovery: the kill -> the next step applied."""
    label = "core" if cell == "cell-0" else "satellite"
    row = Row(f"kill-{label}-training", recovery="kill -> next step applied")
    run = TrainRun(root, model, [], mode="colocate")
    run.start()
    at, before = None, 0
    try:
        await wait_for("step 0 applied", lambda: run.lines("metrics.jsonl") >= 1, run)

        def training() -> bool:
            mine = [s.direction for s in run.switches() if s.cell == cell]
            return len(mine) >= 3 and mine[-1] == "serve_to_train"

        await wait_for(f"{cell} training step 1", training, run)
        pid = run.cell_pid(cell)
        assert pid is not None, f"{cell} not found"
        at, before = time.time(), run.lines("metrics.jsonl")
        os.kill(pid, signal.SIGKILL)
    except (RuntimeError, AssertionError) as exc:
        row.notes.append(f"fault not injected: {exc}")
    await run.wait()
    measure(run, exact, row)
    row.outcome = outcome(run)
    if at is not None:
        after = [s.at_s for s in run.steps() if s.at_s > at]
        row.recovery_s = round(min(after) - at, 2) if after else "never"
        row.notes.append(f"{cell} killed with {before} steps applied")
    return row


async def kill_core(root: Path, model: Path, exact: TokenExactness) -> Row:
    """The core (``cell-0``: the optimizer and the weights) killed right after its serve -> train switch of step 1
    (colocate); the driver must stop at once (``CoreLost``, exit 2, naming ``--resume``), then ``gyre train --resume``
    completes the run; recovery: the kill -> the resumed run applies step 1 (the detection time is in the notes)."""
    row = Row("kill-core-training + resume", recovery="kill -> resumed step applied")
    run = TrainRun(root, model, [], mode="colocate")
    run.start()
    at, before = None, 0
    try:
        await wait_for("step 0 applied", lambda: run.lines("metrics.jsonl") >= 1, run)

        def training() -> bool:
            mine = [s.direction for s in run.switches() if s.cell == "cell-0"]
            return len(mine) >= 3 and mine[-1] == "serve_to_train"

        await wait_for("cell-0 training step 1", training, run)
        pid = run.cell_pid("cell-0")
        assert pid is not None, "cell-0 not found"
        at, before = time.time(), run.lines("metrics.jsonl")
        os.kill(pid, signal.SIGKILL)
    except (RuntimeError, AssertionError) as exc:
        row.notes.append(f"fault not injected: {exc}")
    code = await run.wait()
    if at is not None:
        stopped = time.time() - at
        log = (run.root / "driver-0.log").read_text(errors="replace")
        said = [line for line in log.splitlines() if "error:" in line]
        row.notes.append(f"driver exited {code} {stopped:.1f} s after the kill, {before} steps applied; said: "
                         f"{said[-1][:300] if said else '(nothing)'}")  # fmt: skip
        if code not in (0, None):
            run.start(resume=True)
            await run.wait()
    measure(run, exact, row)
    codes = run.exit_codes
    row.outcome = outcome(run) if len(codes) < 2 else (f"stops (exit {codes[0]}); `--resume` "
                                                       + ("completes" if codes[1] == 0 else f"fails ({codes[1]})"))  # fmt: skip
    if at is not None:
        after = sorted((s.at_s, s.step) for s in run.steps() if s.at_s > at and s.step >= before)
        row.recovery_s = round(after[0][0] - at, 2) if after else "never"
        path = run.run_dir / "journal" / "resumes.jsonl"
        resumes = list(read_journal(path, Resume)) if path.exists() else []
        row.notes.append(
            "resumes: " + "; ".join(f"from step {r.from_step}, {r.reused} reused" for r in resumes)
        )
    return row


async def kill_satellite(root: Path, model: Path, exact: TokenExactness) -> Row:
    return await _kill_training(root, model, exact, "cell-1")


async def control(root: Path, model: Path, exact: TokenExactness) -> Row:
    """Every control message dropped (20%), duplicated (20%) and delayed up to 0.3 s (``[chaos]``), both ways;
    recovery: the run's wall time over the baseline's is in the notes (nothing to recover from at one moment)."""
    row = Row("control: drop/dup/delay", recovery_s="-", recovery="-")
    chaos = [
        "chaos.control_drop=0.2",
        "chaos.control_duplicate=0.2",
        "chaos.control_delay_s=0.3",
        "chaos.seed=7",
    ]
    run = TrainRun(root, model, chaos, mode="colocate")
    run.start()
    await run.wait()
    measure(run, exact, row)
    row.outcome = outcome(run)
    summary = run.run_dir / "train.json"
    if summary.exists():
        data = json.loads(summary.read_text())
        row.notes.append(
            f"controller side: {data.get('injected_faults')}, run {data.get('total_s', 0):.1f} s"
        )
    return row


async def _kill_driver(root: Path, model: Path, exact: TokenExactness, tear: bool) -> Row:
    """The driver's whole session SIGKILLed while step 1 samples (``tear``: then the last line of every journal cut
    in half), then ``gyre train --resume``; recovery: the kill -> the resumed run applying the step in progress."""
    row = Row("kill-driver + tear journals + resume" if tear else "kill-driver + resume",
              recovery="kill -> resumed step applied")  # fmt: skip
    run = TrainRun(root, model, [])
    run.start()
    at = None
    try:
        await wait_for("step 0 applied and step 1 sampling",
                       lambda: run.lines("metrics.jsonl") >= 1 and run.lines("journal/executions.jsonl") > BATCH,
                       run)  # fmt: skip
        at, before = time.time(), run.lines("metrics.jsonl")
        run.kill_all()
        run.exit_codes.append(-9)
        if tear:
            torn = 0
            for path in sorted(run.run_dir.rglob("*.jsonl")):
                data = path.read_bytes()
                if not data:
                    continue
                start = data.rstrip(b"\n").rfind(b"\n") + 1
                path.write_bytes(data[: start + (len(data) - start) // 2])
                torn += 1
            row.notes.append(f"{torn} journals torn")
        run.start(resume=True)
        await run.wait()
    except RuntimeError as exc:
        row.notes.append(f"fault not injected: {exc}")
        await run.wait()
    run.exit_codes = [c for c in run.exit_codes if c != -9]
    measure(run, exact, row)
    row.outcome = outcome(run) + (" after kill" if at is not None else "")
    if at is not None:
        after = sorted(
            (s.at_s, s.step) for s in run.steps() if s.at_s > at and s.step >= before
        )  # not rebuilt
        row.recovery_s = round(after[0][0] - at, 2) if after else "never"
        path = run.run_dir / "journal" / "resumes.jsonl"
        resumes = list(read_journal(path, Resume)) if path.exists() else []
        row.notes.append(
            f"killed with {before} steps applied; resumes: "
            + "; ".join(f"from step {r.from_step}, {r.reused} reused, cut {r.cut}" for r in resumes)
        )
    return row


async def kill_driver(root: Path, model: Path, exact: TokenExactness) -> Row:
    return await _kill_driver(root, model, exact, tear=False)


async def torn_journals(root: Path, model: Path, exact: TokenExactness) -> Row:
    return await _kill_driver(root, model, exact, tear=True)


async def disk_quota(root: Path, model: Path, exact: TokenExactness) -> Row:
    """A running execution's workspace filled past ``sandbox.disk_quota_mib`` (8 MiB) from the host; recovery: the
    write -> that execution journaled (``resource_exceeded``)."""
    row = Row("fill a sandbox's disk quota", recovery="fill -> execution stopped")
    workspaces = root / "ws"
    run = TrainRun(root, model, [f'sandbox.workspace_root="{workspaces}"', "sandbox.disk_quota_mib=8",
                                 "sandbox.quota_check_s=0.2"])  # fmt: skip
    run.start()
    at = None
    try:

        def live_workspace() -> Path | None:
            found = sorted(workspaces.glob("gyre-execution-*/workspace"), key=lambda p: p.stat().st_mtime)
            return found[-1] if found else None

        for _ in range(200):  # the first workspace seen is a running execution's (one lasts seconds)
            await wait_for("a live workspace", lambda: live_workspace() is not None, run)
            target = live_workspace()
            try:
                assert target is not None
                (target / "chaos-fill.bin").write_bytes(os.urandom(16 << 20))
                at = time.time()
                break
            except OSError:
                continue
    except RuntimeError as exc:
        row.notes.append(f"fault not injected: {exc}")
    await run.wait()
    results = measure(run, exact, row, targeted=1 if at is not None else 0)
    row.outcome = outcome(run)
    if at is not None:
        over = [r for r in results if r.status == "resource_exceeded"]
        row.outcome += f"; {len(over)} execution(s) resource_exceeded"
        row.recovery_s = round(min(r.finished_s for r in over) - at, 2) if over else "not detected"
    return row


# A scaffold of its own on the official openai client (two calls through its router session); the execution the
# scenario aims at (HOG: an execution id prefix) then allocates memory until its sandbox kills it.
HOG_SCAFFOLD = """
import os, openai
client, messages = openai.OpenAI(), [{"role": "user", "content": os.environ["GYRE_TASK"]}]
for _ in range(2):
    reply = client.chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=messages, max_tokens=12)
    messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                 {"role": "user", "content": "Go on."}]
if os.environ["GYRE_EXECUTION_ID"].startswith(os.environ.get("HOG", "-")):
    hog = []
    while True:
        hog.append(b"x" * (32 << 20))
"""
HOG_MIB = 384


def hog_agent(target: str) -> str:
    """``run.agent``: `HOG_SCAFFOLD`, run as ``command:`` with execution ids starting ``target`` hogging memory."""
    import shlex

    return f"command:{shlex.join(['env', f'HOG={target}', PY, '-c', HOG_SCAFFOLD])}"


async def memory(root: Path, model: Path, exact: TokenExactness) -> Row:
    """One execution's scaffold (execution 5: step 1) allocates memory past ``sandbox.memory_mib`` (384 MiB) after
    its calls; recovery: its last call answered -> that execution journaled (``resource_exceeded``, killed in its
    sandbox)."""
    row = Row("exhaust a sandbox's memory", recovery="last call -> execution stopped")
    target = "e000005."
    run = TrainRun(
        root, model, [f"run.agent={json.dumps(hog_agent(target))}", f"sandbox.memory_mib={HOG_MIB}"]
    )
    run.start()
    await run.wait()
    results = measure(run, exact, row, targeted=1)
    row.outcome = outcome(run)
    over = [r for r in results if r.execution_id.startswith(target)]
    others = [r for r in results if not r.execution_id.startswith(target)]
    if over:
        r = over[0]
        row.outcome += f"; {r.execution_id}: {r.status}, verdict {r.verdict.outcome if r.verdict else None}"
        last = max((c.timing.finished_s for c in r.records), default=r.started_s)
        row.recovery_s = round(r.finished_s - last, 2)
        row.notes.append(f"its error: {(r.error or '').splitlines()[0][:160]}")
    else:
        row.notes.append(f"fault not injected: no execution {target}*")
    row.notes.append(f"the other {len(others)}: " + ", ".join(f"{n} {s}" for s, n in
                                                           Counter(r.status for r in others).items()))  # fmt: skip
    switches = run.switches()
    row.notes.append(f"{len(switches)} switches, {sum(bool(s.error) for s in switches)} failed")
    return row


async def verifier_fails(root: Path, model: Path, exact: TokenExactness) -> Row:
    """Each start of the verifier's sandbox fails with probability 0.5 (``[chaos] verifier_start_fail``, seed 1:
    two executions fail all 3 attempts); recovery: the longest verification that ended unverified (its 3 attempts and
    the verifier's back-off between them)."""
    row = Row(
        "verifier's sandbox fails to start (p 0.5 per start)", recovery="longest unverified verification"
    )
    run = TrainRun(root, model, ["chaos.verifier_start_fail=0.5", "chaos.seed=1"])
    run.start()
    await run.wait()
    results = measure(run, exact, row)
    row.outcome = outcome(run)
    unverified = [r for r in results if r.verdict is not None and r.verdict.outcome == "dropped"]
    retried = [r for r in results if r.verdict is not None and r.verdict.attempts > 1 and r not in unverified]
    named = {e for s in run.steps() for e in s.execution_ids}
    row.outcome += (f"; {len(unverified)} dropped unverified (trained: {sum(r.execution_id in named for r in unverified)}),"
                    f" {len(retried)} scored after a retry")  # fmt: skip
    if unverified:
        row.recovery_s = round(max(r.verdict.duration_s for r in unverified if r.verdict), 2)
        row.notes.append(
            f"why: {unverified[0].verdict.detail.splitlines()[0][:160] if unverified[0].verdict else ''}"
        )
    summary = run.run_dir / "train.json"
    if summary.exists():
        data = json.loads(summary.read_text())
        row.notes.append(f"train.json: unverified_executions {data.get('unverified_executions')}, "
                         f"{data.get('injected_faults')}")  # fmt: skip
    return row


# ---- role switches under live agents --------------------------------------------------------------------------------
async def switches(root: Path, model: Path, exact: TokenExactness, count: int, agents: int) -> Row:
    """``count`` role switches of two trainable cells (a standalone server stays) under ``agents`` live agents on
    the official ``openai`` client over HTTP; recovery: the slowest switch (its phases end to end)."""
    import openai
    import uvicorn

    from gyre.config import load_config
    from gyre.control.cluster import Cluster
    from gyre.router.app import KEEP_ALIVE_S, build_agent_app

    row = Row(f"{count} switches, {agents} agents", recovery="slowest switch", twice="-", never="-")
    overrides = ["cells.count=2", "cells.standalone=1", "cells.engine_overrides=['engine.kv_cache_mem_gib=0.1']",
                 "cells.num_threads=1", "trainer.heartbeat_s=0.25", "controller.heartbeat_s=0.25",
                 f'trainer.bind="tcp://127.0.0.1:{_free_port()}"']  # fmt: skip
    cfg = load_config(None, overrides)
    errors: list[str] = []
    tokens: list[str] = []
    async with Cluster(cfg, model, root / "run") as cluster:
        port = _free_port()
        server = uvicorn.Server(uvicorn.Config(build_agent_app(cluster.router), host="127.0.0.1", port=port,
                                               log_level="warning", timeout_keep_alive=KEEP_ALIVE_S))  # fmt: skip
        stop = asyncio.Event()

        async def agent(i: int) -> None:
            rng = random.Random(i)
            while not stop.is_set():
                token = cluster.router.open_session(f"agent-{i}-{len(tokens)}")
                tokens.append(token)
                client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/s/{token}/v1", api_key="unused",
                                            max_retries=0, timeout=600)  # fmt: skip
                messages: list[Any] = [{"role": "user", "content": f"agent {i} says hello"}]
                try:
                    for _ in range(3):
                        r = await client.chat.completions.create(
                            model=model.name,
                            messages=messages,
                            max_tokens=rng.randrange(8, 48),
                            temperature=1.0,
                        )
                        messages += [r.choices[0].message.model_dump(exclude_none=True),
                                     {"role": "user", "content": "go on"}]  # fmt: skip
                        await asyncio.sleep(rng.uniform(0, 4.0))
                except openai.OpenAIError as exc:
                    errors.append(f"agent {i}: {exc!r}")
                finally:
                    await client.close()

        async with asyncio.TaskGroup() as group:
            group.create_task(server.serve())
            while not server.started:  # noqa: ASYNC110 (uvicorn sets a flag, no event)
                await asyncio.sleep(0.05)
            tasks = [group.create_task(agent(i)) for i in range(agents)]
            with Progress(console=console, transient=True) as progress:
                bar = progress.add_task("switches", total=count)
                controller = cluster.controller
                done = 0
                cycle = [(controller.to_train, "cell-0"), (controller.to_train, "cell-1"),
                         (controller.to_serve, "cell-1"), (controller.to_serve, "cell-0")]  # fmt: skip
                while done < count:
                    switch, name = cycle[done % 4]
                    await switch(name)
                    done += 1
                    progress.advance(bar)
                for name in ("cell-1", "cell-0"):
                    if any(v.name == name and v.role == "training" for v in controller.cell_views()):
                        await controller.to_serve(name)
            stop.set()
            await asyncio.gather(*tasks)
            server.should_exit = True
        sessions = [cluster.router.records(t) for t in tokens]
    journaled = list(read_journal(root / "run" / "switches.jsonl", SwitchRecord))
    checked, bad = exact.count(root / "run", sessions)
    row.lost = "-"
    row.errors = len(errors)
    row.not_exact = bad
    row.recovery_s = round(max((s.total_s for s in journaled), default=0.0), 2)
    failed = sum(bool(s.error) for s in journaled)
    row.outcome = f"{len(journaled)} switches journaled, {failed} failed, " \
                  f"{sum(s.moved_calls for s in journaled)} calls moved mid-generation"  # fmt: skip
    row.notes.append(f"{len(tokens)} sessions, {checked} records checked; no trainer steps (weights stay at "
                     "version 0), so micro-steps do not apply; lost: agents are not executions here")  # fmt: skip
    if errors:
        row.notes.append(f"first error: {errors[0][:200]}")
    return row


SCENARIOS: dict[str, Scenario] = {
    "baseline": baseline,
    "kill-serving": kill_serving,
    "kill-core": kill_core,
    "kill-satellite": kill_satellite,
    "hang-engine": hang_engine,
    "control": control,
    "kill-driver": kill_driver,
    "torn-journals": torn_journals,
    "disk-quota": disk_quota,
    "memory": memory,
    "verifier-fails": verifier_fails,
}


def table(rows: list[Row]) -> Table:
    t = Table(title="Chaos under a live gyre train (issue 17)")
    for col in ("scenario", "lost", "agent errors", "not token-exact", "twice", "never", "recovery s",
                "recovery is", "outcome"):  # fmt: skip
        t.add_column(col)
    for r in rows:
        t.add_row(r.scenario, *(str(x) for x in (r.lost, r.errors, r.not_exact, r.twice, r.never, r.recovery_s)),
                  r.recovery, r.outcome)  # fmt: skip
    return t


async def main_async(args: argparse.Namespace) -> list[Row]:
    from gyre.engine.models import init_model

    out = Path(args.out or tempfile.mkdtemp(prefix="gyre-chaos-"))
    model = Path(args.model) if args.model else init_model(out / "tiny", preset="tiny", seed=0)
    exact = TokenExactness(model)
    names = list(SCENARIOS) + ["switches"] if args.scenarios == "all" else args.scenarios.split(",")
    unknown = [n for n in names if n not in SCENARIOS and n != "switches"]
    if unknown:
        raise SystemExit(f"unknown scenarios {unknown}; choose from {', '.join([*SCENARIOS, 'switches'])}")
    rows = []
    with Progress(console=console) as progress:
        bar = progress.add_task("scenarios", total=len(names))
        for name in names:
            progress.update(bar, description=name)
            started = time.monotonic()
            if name == "switches":
                row = await switches(out / name, model, exact, args.switches, args.agents)
            else:
                row = await SCENARIOS[name](out / name, model, exact)
            row.notes.append(f"{time.monotonic() - started:.0f} s")
            rows.append(row)
            progress.console.print(f"{name}: {row.outcome} ({'; '.join(row.notes)})", markup=False)
            progress.advance(bar)
    console.print(table(rows))
    for r in rows:
        console.print(f"- {r.scenario}: {'; '.join(r.notes)}", markup=False)
    RESULTS.mkdir(exist_ok=True)
    for path in (out / "chaos.json", RESULTS / "chaos.json"):
        path.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    console.print(f"run directories in {out}; rows in {RESULTS / 'chaos.json'}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scenarios", default="all", help=f"comma-separated: {', '.join([*SCENARIOS, 'switches'])}"
    )
    parser.add_argument("--switches", type=int, default=40, help="role switches in the switches scenario")
    parser.add_argument("--agents", type=int, default=200, help="live agents in the switches scenario")
    parser.add_argument("--model", default="", help="a model directory (default: a fresh tiny one)")
    parser.add_argument("--out", default="", help="where run directories go (default: a new temp dir)")
    args = parser.parse_args()
    rows = asyncio.run(main_async(args))
    sys.exit(0 if rows else 1)


if __name__ == "__main__":
    main()

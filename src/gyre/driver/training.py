"""`gyre train`: the online-RL loop. Task suite -> runtime -> router -> cells -> verifier -> trajectory processor ->
elastic trainer -> new weights -> serving, for ``run.steps`` steps, in the mode ``[controller]`` names.

The whole loop is `train` below; every piece it composes lives in its own module. Everything lands in one run
directory (layout: `gyre.driver.rundir`). A driver killed at any moment is continued by ``train(cfg, resume=True)``
(`gyre train --resume RUN_DIR`, see `pick_up`): each finished execution trains exactly once, in the step its index
names, and the step in progress trains again from the last checkpoint with the same data plus the executions that
had not finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import re
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec

from gyre.agents.toolagent import BuiltinAgentConfig
from gyre.config import GyreConfig, load_config
from gyre.control.books import Books
from gyre.control.chaos import FaultyStarts
from gyre.control.cluster import Cluster
from gyre.control.loop import ElasticLoop, LoopResult, group_micro_steps
from gyre.control.placement import Launcher, LocalLauncher, RayLauncher, ray_config
from gyre.control.policy import ToServe
from gyre.driver import view
from gyre.driver.evaluation import agent_spec, bootstrap_ci
from gyre.driver.eventloop import run as run_loop
from gyre.driver.rundir import RunDir, default_run_dir
from gyre.driver.runreport import write_report
from gyre.errors import ConfigError, CoreLost
from gyre.journal import Journal, read_journal
from gyre.protocol import StepMetrics
from gyre.runtime import (
    AgentSpec,
    BuiltinAgentSpec,
    ExecutionResult,
    ExecutionSpec,
    OracleAgentSpec,
    PythonAgentSpec,
    Runtime,
)
from gyre.runtime.shard import RuntimeSpec
from gyre.runtime.shards import Runner, ShardedRuntime, ShardHub, read_executions
from gyre.tasks import Task, Verifier, resolve_suite
from gyre.train.layout import check_run_layout
from gyre.train.step import Rollout

log = logging.getLogger(__name__)


class StepRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One line of ``metrics.jsonl``: an applied step, what was sampled for it and what training did."""

    step: int
    wall_s: float  # since the run (or its last resume) started
    reward_mean: float
    reward_std: float
    pass_rate: float  # executions scoring 1.0
    executions: int
    dropped: int  # executions not trained (verifier failed, crashed)
    trainer: StepMetrics
    at_s: float = 0.0  # wall clock (time.time()) when it was applied
    execution_ids: list[str] = msgspec.field(default_factory=list)  # the executions whose data trained in it
    sampled_tokens: int = 0  # output tokens its executions sampled
    tampered: int = 0  # executions the verifier caught tampering with the grader (trained, reward 0)
    groups: int = 0  # task groups among its executions
    flat_groups: int = 0  # groups whose executions all scored alike: zero advantage, they teach nothing


class EvalPoint(msgspec.Struct, frozen=True, kw_only=True):
    """One line of ``eval.jsonl``: the held-out suite after ``step`` applied steps."""

    step: int
    version: int  # the weight version most of its tokens were sampled with
    mean: float  # mean partial score over scored executions
    ci_low: float  # 95% bootstrap interval of the mean
    ci_high: float
    pass_rate: float
    executions: int
    at_s: float
    failed: int = 0  # executions that crashed or made no model call (counted in the mean as scored)
    tampered: int = 0  # executions the verifier caught tampering with the grader (counted in the mean as 0)
    scores: dict[str, float] = {}  # task/k -> score of each scored execution (points compare pairwise)


class Resume(msgspec.Struct, frozen=True, kw_only=True):
    """One line of ``journal/resumes.jsonl``: where a `gyre train --resume` picked the run up."""

    at_s: float
    attempt: int  # 1 for the first resume
    from_step: int  # steps in the checkpoint it continued from
    reused: int  # finished executions of later steps taken from the journal, not run again
    cut: dict[str, int]  # journal -> bytes of a torn last line cut off
    dropped_steps: int  # metrics lines of steps past the checkpoint, trained again


class TrainSummary(msgspec.Struct, frozen=True, kw_only=True):
    """``train.json``: the run in a few numbers."""

    run_dir: str
    mode: str
    steps: int
    total_s: float
    idle_fraction: float
    switches: int
    failed_executions: int
    reward_first: float  # mean reward of the first step's executions
    reward_last: float
    eval_first: float | None = None  # held-out mean score before the first step and after the last
    eval_last: float | None = None
    resumes: int = 0
    tampered_executions: int = 0  # executions caught tampering with the grader, over all steps
    # [chaos] on the controller's control messages (sent, dropped...), the driver's submits (submits_...) and the
    # verifier's sandbox starts (verifier_starts...)
    injected_faults: dict[str, int] = {}
    unverified_executions: int = 0  # the verifier could not run on any attempt: dropped, never scored


class _PickUp(msgspec.Struct, kw_only=True):
    """What a run directory holds for the driver: applied steps, their records, finished executions to reuse."""

    start: int = 0  # steps applied (the checkpoint training continues from)
    attempt: int = 0  # resumes before this one
    records: list[StepRecord] = msgspec.field(default_factory=list)
    reused: dict[int, ExecutionResult] = msgspec.field(default_factory=dict)  # execution index -> result


def step_tasks(cfg: GyreConfig) -> list[Task]:
    """The tasks of every step, in order: the suite shuffled, walked without replacement, reshuffled when spent."""
    suite, rng = resolve_suite(cfg.run.suite), random.Random(cfg.run.seed)
    order: list[Task] = []
    while len(order) < cfg.run.steps * cfg.run.tasks_per_step:
        order += rng.sample(suite, len(suite))
    return order[: cfg.run.steps * cfg.run.tasks_per_step]


def execution_id(index: int, attempt: int, task: Task, group_index: int) -> str:
    """``e<index>.<attempt>/<task>/<member>``: execution ``index`` of the run (step ``index // batch``), started by
    the driver's ``attempt``-th resume (0: the first run)."""
    return f"e{index:06d}.{attempt}/{task.id}/{group_index}"


def execution_index(execution_id: str) -> int | None:
    """The run's execution index in an id `execution_id` made; None for any other id."""
    match = re.match(r"^e(\d+)\.\d+/", execution_id)
    return int(match.group(1)) if match else None


async def train(
    cfg: GyreConfig, live: bool = False, resume: bool = False, ray: str | None = None
) -> TrainSummary:
    """Run ``cfg.run.steps`` online-RL steps; everything lands in the run directory (``live``: the terminal view).
    ``resume``: continue the run in ``cfg.run.run_dir`` from its last checkpoint (see `pick_up`). ``ray``: the Ray
    cluster's address (``auto``: the one this machine belongs to) to place the cells and the shards on
    (`gyre.control.placement`); None: every process on this machine."""
    if ray is not None:
        cfg = ray_config(cfg)
    run = cfg.run
    rd = RunDir(run.run_dir or default_run_dir("train", run.suite))
    if cfg.trainer.resume_from and not resume:
        raise ConfigError("gyre train sets trainer.resume_from itself (--resume RUN_DIR); to start from a "
                          "checkpoint, name it as run.model_path")  # fmt: skip
    if resume and cfg.controller.carry_over:  # its steps trained executions out of dispatch order
        raise ConfigError("a run with controller.carry_over cannot be resumed yet: its steps train executions "
                          "in the order they finished, and resuming picks up by dispatch order")  # fmt: skip
    # the core cell's layout fits the model and the cell's devices, or the run is refused before anything starts
    log.info(check_run_layout(cfg.trainer, run.model_path, None if ray is None else cfg.ray.cell_gpus,
                              cfg.engine.context_length))  # fmt: skip
    picked = pick_up(rd, run.batch_executions) if resume else _PickUp()
    cfg = msgspec.structs.replace(
        cfg,
        run=msgspec.structs.replace(run, run_dir=str(rd.root)),
        router=msgspec.structs.replace(cfg.router, model_path=run.model_path, journal_dir=str(rd.journal)),
        trainer=msgspec.structs.replace(cfg.trainer, checkpoint_dir=str(rd.checkpoints),
                                        checkpoint_every_steps=cfg.trainer.checkpoint_every_steps or 1,
                                        resume_from=str(rd.checkpoint(picked.start)) if picked.start else "",
                                        loss=msgspec.structs.replace(cfg.trainer.loss,  # as the policy sampled
                                                                     temperature=run.agent_temperature or 1.0)),
    )  # fmt: skip
    tasks, batch, started = step_tasks(cfg), run.batch_executions, time.monotonic()
    held_out = resolve_suite(run.eval_suite)[: run.eval_tasks or None] if run.eval_suite else []
    agent = _agent(cfg, tasks)
    tampered_ids: set[str] = set()  # executions the verifier caught tampering with the grader
    records = list(picked.records)
    evals = list(read_journal(rd.eval, EvalPoint)) if resume and rd.eval.exists() else []
    metrics, eval_log, timeline = Journal(rd.root, "metrics.jsonl"), Journal(rd.root, "eval.jsonl"), \
        Journal(rd.root, "timeline.jsonl")  # fmt: skip
    board = _board(rd, purge_step=picked.start)

    async def execute(index: int) -> Rollout:  # the loop's execution ``index`` (of the steps still to apply)
        index += picked.start * batch
        step, within = divmod(index, batch)
        task = tasks[step * run.tasks_per_step + within // run.group_size]
        result = picked.reused.pop(index, None) or await runtime.run_one(ExecutionSpec(
            task=task, group_index=within % run.group_size, agent=agent,
            execution_id=execution_id(index, picked.attempt, task, within % run.group_size)))  # fmt: skip
        rollout = Rollout(execution_id=result.execution_id, group=f"{step}/{task.id}", reward=result.reward,
                          records=result.records, dropped=not result.trainable, why=dropped_why(result))  # fmt: skip
        if is_tampered(result):
            tampered_ids.add(result.execution_id)
        return rollout

    # journaled before the loop goes on; the rollouts it trained (with carry-over, not only those dispatched for it)
    def on_step(step: int, trained: StepMetrics, step_rollouts: list[Rollout]) -> None:
        step += picked.start
        caught = sum(r.execution_id in tampered_ids for r in step_rollouts)
        record = step_record(step, step_rollouts, trained, time.monotonic() - started, tampered=caught)
        metrics.append(record)
        records.append(record)
        for tag, value in scalars(record).items():
            board.add_scalar(tag, value, step)
        board.flush()
        if run.eval_every and (step + 1) % run.eval_every == 0 and step + 1 < run.steps:
            group.create_task(evaluate(step + 1, loop))

    async def evaluate(step: int, sharing: ElasticLoop | None = None) -> None:  # on what serving cells serve
        if not held_out or any(e.step == step for e in evals):
            return
        size = len(held_out) * run.eval_samples
        with sharing.outside(size) if sharing is not None else contextlib.nullcontext():
            point = await evaluate_held_out(cfg, eval_runtime, agent, held_out, step)
        eval_log.append(point)
        evals.append(point)
        board.add_scalar("eval/mean", point.mean, step)

    # [chaos] verifier_start_fail, on the run's executions (not held-out ones; in each shard when shards run them)
    starts = FaultyStarts(cfg.chaos)
    async with _placed(cfg, rd, ray, starts) as (cluster, runtime, eval_runtime):
        try:
            books = Books(batch, run.burst_steps, run.steps - picked.start)
            loop = ElasticLoop(cluster.controller, cfg.controller, books, run.group_size, execute,
                               group_micro_steps(cfg.trajectory, batch, cfg.trainer.loss.kl_coef), on_step=on_step)  # fmt: skip
            await evaluate(picked.start)  # before training (or where a resumed run picks up)
            try:
                async with asyncio.TaskGroup() as group:
                    watchers = [group.create_task(_record_timeline(loop, timeline))]
                    if live:
                        shards = runtime.hub.statistics if isinstance(runtime, ShardedRuntime) else None
                        watchers.append(
                            group.create_task(view.show(cluster.controller, books, records, started, shards))
                        )
                    result = await loop.run()
                    for watcher in watchers:
                        watcher.cancel()
            # the core died: the run stops, resumable from its last checkpoint
            except ExceptionGroup as failed:
                lost, _ = failed.split(CoreLost)
                if lost is None:
                    raise
                if cfg.controller.carry_over:
                    raise CoreLost(f"{lost.exceptions[0]}. A run with controller.carry_over cannot be resumed "
                                   f"yet; its checkpoints (step {rd.latest_checkpoint()}) are in "
                                   f"{rd.checkpoints}") from None  # fmt: skip
                raise CoreLost(f"{lost.exceptions[0]}. Every finished execution is journaled; continue the run "
                               f"from its last checkpoint (step {rd.latest_checkpoint()}) with "
                               f"`gyre train --resume {rd.root}`") from None  # fmt: skip
            if held_out:  # the last weights, served by every cell
                await cluster.controller.apply([ToServe(v.name) for v in cluster.controller.cell_views()
                                                if v.role == "training"])  # fmt: skip
            await evaluate(run.steps)
            injected = cluster.controller.link.counts() if cluster.controller.link.active else {}
            if loop.trainer.faults.active:
                injected |= {f"submits_{k}": v for k, v in loop.trainer.faults.counts().items()}
            if starts.active and not cfg.shards.count:  # with shards they are tried there, not counted here
                injected |= starts.counts()
        finally:
            await runtime.aclose()
            await eval_runtime.aclose()
            for journal in (metrics, eval_log, timeline):
                journal.close()
            board.close()
    return summarize(rd, cfg, result, records, evals, picked.attempt, injected)


@contextlib.asynccontextmanager
async def _placed(
    cfg: GyreConfig, rd: RunDir, ray: str | None, starts: FaultyStarts
) -> AsyncIterator[tuple[Cluster, Runner, Runner]]:
    """The cells and what runs the executions (the run's, the held-out ones): runtimes in this process, or
    ``shards.count`` shards; placed on this machine, or by Ray on the cluster at ``ray``."""
    # Ray's placement waits for room on the cluster, before anything else runs in this loop
    launcher: Launcher = LocalLauncher() if ray is None else RayLauncher(cfg, ray, rd.journal)
    try:
        if not cfg.shards.count:
            verifier = Verifier(cfg.sandbox, start_fault=starts.fails if starts.active else None)
            async with Cluster(cfg, cfg.run.model_path, rd.root, launcher) as cluster:
                assert cluster.router is not None
                yield (cluster, Runtime(cluster.router, cfg.sandbox, str(rd.journal), verifier=verifier),
                       Runtime(cluster.router, cfg.sandbox, str(rd.eval_journal), verifier=Verifier(cfg.sandbox)))  # fmt: skip
            return
        runtimes = {"run": RuntimeSpec(journal_dir=str(rd.journal), chaos_starts=True),
                    "eval": RuntimeSpec(journal_dir=str(rd.eval_journal))}  # fmt: skip
        async with (
            ShardHub(cfg, rd.root, runtimes, launcher) as hub,
            Cluster(cfg, cfg.run.model_path, rd.root, launcher, pool=hub.pool) as cluster,
        ):
            yield cluster, ShardedRuntime(hub, "run"), ShardedRuntime(hub, "eval")
    finally:
        await asyncio.to_thread(launcher.close)


class Trainer:
    """`gyre train` from Python: ``Trainer(load_config("run.toml")).run()``; ``Trainer.resume(RUN_DIR)`` continues a
    killed run. Blocking (each call runs its own event loop); inside a running loop, await `train` instead."""

    def __init__(self, cfg: GyreConfig) -> None:
        self.cfg = cfg

    def run(self, live: bool = False) -> TrainSummary:
        """Train ``cfg.run.steps`` steps; the run directory holds everything (see `gyre.driver.rundir`)."""
        return run_loop(train(self.cfg, live=live))

    @classmethod
    def resume(cls, run_dir: str | Path, steps: int | None = None, live: bool = False) -> TrainSummary:
        """Continue the run in ``run_dir`` from its last checkpoint (``steps``: a new total)."""
        cfg = resume_config(run_dir, [f"run.steps={steps}"] if steps is not None else [])
        return run_loop(train(cfg, live=live, resume=True))


def resume_config(run_dir: str | Path, overrides: list[str]) -> GyreConfig:
    """A killed run's own resolved config (``RUN_DIR/config.toml``) with ``overrides``, for ``train(resume=True)``:
    the run directory is where it lies now, and the checkpoint to continue from is the one `pick_up` finds."""
    rd = RunDir(run_dir)
    if not rd.config.is_file():
        raise ConfigError(f"{run_dir} is not a gyre train run directory (no config.toml)")
    return load_config(
        rd.config, [*overrides, f"run.run_dir={json.dumps(str(rd.root))}", "trainer.resume_from="]
    )


def pick_up(rd: RunDir, batch: int) -> _PickUp:
    """Where a killed run stands, made consistent for `train` to continue it.

    Torn last lines are cut off every journal. Training continues from the latest complete checkpoint (N steps):
    metrics lines of later steps are dropped (those steps train again) and a missing line of a checkpointed step is
    rebuilt from the checkpoint (its metrics and the executions it trained). Every finished execution of a step
    past N is reused as journaled, never run again; executions that had not finished run from the start.
    """
    if not rd.config.is_file():
        raise ConfigError(f"{rd.root} is not a gyre train run directory (no config.toml)")
    cut = rd.repair()
    start = rd.latest_checkpoint()
    journaled = list(read_journal(rd.metrics, StepRecord)) if rd.metrics.exists() else []
    kept = {r.step: r for r in journaled if r.step < start}
    for step in range(start):
        if step not in kept and (rebuilt := _from_checkpoint(rd, step)) is not None:
            kept[step] = rebuilt
    records = [kept[s] for s in sorted(kept)]
    lines = {r.step: msgspec.json.encode(r) + b"\n" for r in records}
    dropped = sum(r.step >= start for r in journaled)
    rd.replace(rd.metrics, b"".join(lines[s] for s in sorted(lines)))
    reused: dict[int, ExecutionResult] = {}
    for result in read_executions(rd.journal):
        index = execution_index(result.execution_id)
        if index is not None and index >= start * batch and result.status != "cancelled":
            reused.setdefault(index, result)  # a cancelled one (the run stopped under it) runs again
    attempt = 1 + (sum(1 for _ in read_journal(rd.resumes, Resume)) if rd.resumes.exists() else 0)
    resumes = Journal(rd.journal, rd.resumes.name)
    resumes.append(Resume(at_s=time.time(), attempt=attempt, from_step=start, reused=len(reused), cut=cut,
                          dropped_steps=dropped))  # fmt: skip
    resumes.close()
    log.info("resuming %s from step %d: %d finished executions reused, torn lines cut: %s", rd.root, start,
             len(reused), cut or "none")  # fmt: skip
    return _PickUp(start=start, attempt=attempt, records=records, reused=reused)


def _from_checkpoint(rd: RunDir, step: int) -> StepRecord | None:
    """Step ``step``'s metrics line from the checkpoint written when it was applied (the driver died before it
    journaled the line); rewards from the executions it trained."""
    try:
        state = json.loads((rd.checkpoint(step + 1) / "trainer_state.json").read_text())
        trainer = msgspec.convert(state["metrics"], StepMetrics)
    except (OSError, KeyError, ValueError, msgspec.ValidationError):
        log.warning("no metrics for step %d in %s: its line stays missing", step, rd.checkpoint(step + 1))
        return None
    ids = set(state.get("data_cursor", {}).get("execution_ids", []))
    results = [r for r in read_executions(rd.journal) if r.execution_id in ids]
    rollouts = [Rollout(execution_id=r.execution_id, group="", reward=r.reward, records=r.records,
                        dropped=not r.trainable) for r in results]  # fmt: skip
    return step_record(step, rollouts, trainer, 0.0, tampered=sum(map(is_tampered, results)))


def dropped_why(result: ExecutionResult) -> str:
    """Why an execution is not trained, in a few words (empty when it is)."""
    if result.trainable:
        return ""
    if result.verdict is not None:
        why = f"verifier {result.verdict.outcome}" + (
            f": {result.verdict.detail}" if result.verdict.detail else ""
        )
    else:
        why = f"{result.status}" + (f": {result.error}" if result.error else "")
    return why.splitlines()[0][:200] if why else "dropped"


def is_tampered(result: ExecutionResult) -> bool:
    """Whether the verifier caught the execution tampering with the grader."""
    return result.verdict is not None and result.verdict.outcome == "tampered"


def step_record(
    step: int, rollouts: list[Rollout], trained: StepMetrics, wall_s: float, *, tampered: int = 0
) -> StepRecord:
    """The metrics line of an applied step (``tampered``: how many of its executions tampered with the grader)."""
    kept = [r for r in rollouts if not r.dropped]
    rewards = [r.reward for r in kept]
    by_group: dict[str, list[float]] = {}
    for r in kept:
        if r.group:
            by_group.setdefault(r.group, []).append(r.reward)
    return StepRecord(
        step=step, wall_s=wall_s, reward_mean=statistics.fmean(rewards) if rewards else 0.0,
        reward_std=statistics.pstdev(rewards) if rewards else 0.0,
        pass_rate=sum(r >= 1.0 for r in rewards) / max(len(rewards), 1), executions=len(rollouts),
        dropped=len(rollouts) - len(kept), trainer=trained, at_s=time.time(),
        execution_ids=[r.execution_id for r in kept], groups=len(by_group),
        flat_groups=sum(max(g) - min(g) < 1e-9 for g in by_group.values()),
        sampled_tokens=sum(len(c.output_ids) for r in rollouts for c in r.records), tampered=tampered,
    )  # fmt: skip


async def evaluate_held_out(
    cfg: GyreConfig, runtime: Runner, agent: AgentSpec, tasks: list[Task], step: int
) -> EvalPoint:
    """The held-out ``tasks``, ``run.eval_samples`` executions each, scored as `gyre eval` scores: the mean partial
    score of scored executions with a 95% bootstrap interval over executions."""
    run = cfg.run
    if isinstance(agent, BuiltinAgentSpec):
        temperature = agent.config.temperature if run.eval_temperature is None else run.eval_temperature
        agent = BuiltinAgentSpec(
            config=msgspec.structs.replace(agent.config, temperature=temperature, seed=run.eval_seed)
        )
    elif isinstance(agent, PythonAgentSpec) and run.eval_temperature is not None:
        agent = msgspec.structs.replace(agent, temperature=run.eval_temperature)
    results = await asyncio.gather(*(
        runtime.run_one(ExecutionSpec(task=t, group_index=k, agent=agent, execution_id=f"eval-{step}/{t.id}/{k}"))
        for t in tasks for k in range(run.eval_samples)
    ))  # fmt: skip
    scores = [r.reward for r in results if r.trainable]
    if failed := [r.execution_id for r in results if r.status == "crashed" or not r.calls]:
        log.warning("held-out evaluation at step %d: %d executions crashed or made no model call (%s ...)", step,
                    len(failed), failed[0])  # fmt: skip
    versions = Counter(c.weight_version for r in results for c in r.records)
    low, high = bootstrap_ci(scores, seed=step)
    return EvalPoint(step=step, version=versions.most_common(1)[0][0] if versions else step,
                     mean=statistics.fmean(scores) if scores else 0.0, ci_low=low, ci_high=high,
                     pass_rate=sum(s >= 1.0 for s in scores) / max(len(scores), 1), executions=len(results),
                     at_s=time.time(), failed=len(failed), tampered=sum(map(is_tampered, results)),
                     scores={f"{r.task_id}/{r.group_index}": r.reward for r in results if r.trainable})  # fmt: skip


def summarize(
    rd: RunDir,
    cfg: GyreConfig,
    result: LoopResult,
    records: list[StepRecord],
    evals: list[EvalPoint],
    resumes: int,
    injected: dict[str, int] | None = None,
) -> TrainSummary:
    """``train.json`` and ``report.html``, from the whole run (earlier attempts' steps included)."""
    evals = sorted(evals, key=lambda e: e.step)
    summary = TrainSummary(run_dir=str(rd.root), mode=cfg.controller.mode, steps=len(records),
                           total_s=result.total_s, idle_fraction=result.idle_fraction,
                           switches=len(result.switches), failed_executions=result.failed_executions,
                           reward_first=records[0].reward_mean if records else 0.0,
                           reward_last=records[-1].reward_mean if records else 0.0,
                           eval_first=evals[0].mean if evals else None,
                           eval_last=evals[-1].mean if evals else None, resumes=resumes,
                           tampered_executions=sum(r.tampered for r in records),
                           injected_faults=injected or {}, unverified_executions=_unverified(rd))  # fmt: skip
    rd.summary.write_bytes(msgspec.json.format(msgspec.json.encode(summary)))
    write_report(rd.root)
    return summary


def _unverified(rd: RunDir) -> int:
    """Executions of the run (a resumed one's repeat replacing the first attempt) whose verifier could not run on
    any attempt of its retry budget: dropped from training, never scored."""
    latest: dict[int, ExecutionResult] = {}
    for result in sorted(read_executions(rd.journal), key=lambda r: r.finished_s):
        if (index := execution_index(result.execution_id)) is not None:
            latest[index] = result
    return sum(r.verdict is not None and r.verdict.outcome == "dropped" and r.verdict.attempts > 0
               and r.status != "resource_exceeded" for r in latest.values())  # fmt: skip


def _agent(cfg: GyreConfig, tasks: list[Task]) -> AgentSpec:
    """``run.agent``: the built-in agent with the run's limits, a command scaffold or a python callable (all train)."""
    run = cfg.run
    spec = agent_spec(run.agent, tasks)
    if isinstance(spec, OracleAgentSpec):
        raise ConfigError(
            "run.agent = 'oracle' samples nothing from the policy; use gyre sft on its demonstrations"
        )
    if isinstance(spec, BuiltinAgentSpec):
        return BuiltinAgentSpec(config=BuiltinAgentConfig(max_steps=run.agent_max_calls, delegation=False,
                                                          max_tokens_per_call=run.agent_max_tokens,
                                                          temperature=run.agent_temperature,
                                                          profile=run.agent_profile,
                                                          max_idle_calls=run.agent_max_idle_calls))  # fmt: skip
    if isinstance(spec, PythonAgentSpec):  # the run's limits and sampling temperature, for it to pass on
        return msgspec.structs.replace(spec, max_steps=run.agent_max_calls, max_tokens=run.agent_max_tokens,
                                       temperature=run.agent_temperature)  # fmt: skip
    return spec


async def _record_timeline(loop: ElasticLoop, journal: Journal, every_s: float = 1.0) -> None:
    """A `LoopSample` a second into ``timeline.jsonl``, until cancelled."""
    while True:
        journal.append(loop.sample())
        await asyncio.sleep(every_s)


def scalars(record: StepRecord) -> dict[str, float]:
    """A step's figures as TensorBoard scalars (tag -> value)."""
    t = record.trainer
    return {
        "reward/mean": record.reward_mean, "reward/std": record.reward_std, "reward/pass_rate": record.pass_rate,
        "executions/dropped": record.dropped, "executions/tampered": record.tampered, "train/loss": t.loss,
        "train/grad_norm": t.grad_norm, "train/entropy": t.entropy, "train/kl": t.kl,
        "train/clip_fraction": t.clip_fraction, "train/ratio_mean": t.ratio_mean, "train/lr": t.lr, "train/tokens": t.tokens,
        "train/computed_tokens": t.computed_tokens, "train/staleness_mean": t.staleness_mean,
        "time/step_s": t.seconds, "time/wall_s": record.wall_s,
    }  # fmt: skip


def _board(rd: RunDir, purge_step: int = 0) -> Any:
    """A TensorBoard event writer in ``RUN_DIR/tensorboard`` (``tensorboard --logdir`` opens it); a resumed run
    purges the events of steps it trains again."""
    from tensorboardX import SummaryWriter

    return SummaryWriter(str(rd.tensorboard), purge_step=purge_step or None)

"""`gyre train`: the online-RL loop. Task suite -> runtime -> router -> cells -> verifier -> trajectory processor ->
elastic trainer -> new weights -> serving, for ``run.steps`` steps, in the mode ``[controller]`` names.

The whole loop is `train` below; every piece it composes lives in its own module. The run directory holds
``config.toml`` (resolved), ``journal/`` (``calls.jsonl``, ``executions.jsonl``: every call token-exact, every
execution with its verdict), ``switches.jsonl``, ``metrics.jsonl`` (a line per applied step), ``checkpoints/step-N``
(Hugging Face weights + optimizer state), ``logs/`` (one per cell) and ``train.json`` (the summary).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec

from gyre import view
from gyre.agents.builtin import BuiltinAgentConfig
from gyre.config import GyreConfig
from gyre.control.books import Books
from gyre.control.cluster import Cluster
from gyre.control.loop import ElasticLoop, group_micro_steps
from gyre.journal import Journal
from gyre.protocol import StepMetrics
from gyre.report import write_report
from gyre.runtime import BuiltinAgentSpec, ExecutionSpec, Runtime
from gyre.tasks import Task, Verifier, resolve_suite
from gyre.train.step import Rollout


class StepRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One line of ``metrics.jsonl``: an applied step, what was sampled for it and what training did."""

    step: int
    wall_s: float  # since the run started
    reward_mean: float
    reward_std: float
    pass_rate: float  # executions scoring 1.0
    executions: int
    dropped: int  # executions not trained (verifier failed, crashed)
    trainer: StepMetrics
    at_s: float = 0.0  # wall clock (time.time()) when it was applied


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


def default_run_dir(cfg: GyreConfig) -> Path:
    """``runs/train-<suite>-<time>``."""
    suite = cfg.run.suite.replace("/", "_").replace(":", "-")
    return Path("runs") / f"train-{suite}-{time.strftime('%Y%m%d-%H%M%S')}"


def step_tasks(cfg: GyreConfig) -> list[Task]:
    """The tasks of every step, in order: the suite shuffled, walked without replacement, reshuffled when spent."""
    suite, rng = resolve_suite(cfg.run.suite), random.Random(cfg.run.seed)
    order: list[Task] = []
    while len(order) < cfg.run.steps * cfg.run.tasks_per_step:
        order += rng.sample(suite, len(suite))
    return order[: cfg.run.steps * cfg.run.tasks_per_step]


async def train(cfg: GyreConfig, live: bool = False) -> TrainSummary:
    """Run ``cfg.run.steps`` online-RL steps; everything lands in the run directory (``live``: the terminal view)."""
    run, run_dir = cfg.run, Path(cfg.run.run_dir or default_run_dir(cfg))
    journal = run_dir / "journal"
    cfg = msgspec.structs.replace(
        cfg,
        run=msgspec.structs.replace(run, run_dir=str(run_dir)),
        router=msgspec.structs.replace(cfg.router, model_path=run.model_path, journal_dir=str(journal)),
        trainer=msgspec.structs.replace(cfg.trainer, checkpoint_dir=str(run_dir / "checkpoints"),
                                        checkpoint_every_steps=cfg.trainer.checkpoint_every_steps or 1),
    )  # fmt: skip
    tasks, batch, started = step_tasks(cfg), run.batch_executions, time.monotonic()
    agent = BuiltinAgentSpec(config=BuiltinAgentConfig(max_steps=run.agent_max_calls, delegation=False,
                                                       max_tokens_per_call=run.agent_max_tokens,
                                                       temperature=run.agent_temperature))  # fmt: skip
    rollouts: dict[int, list[Rollout]] = defaultdict(list)
    records: list[StepRecord] = []
    metrics = Journal(run_dir, "metrics.jsonl")
    board = _board(run_dir)

    async def execute(index: int) -> Rollout:  # one execution of the task its index names
        step, within = divmod(index, batch)
        task = tasks[step * run.tasks_per_step + within // run.group_size]
        result = await runtime.run_one(
            ExecutionSpec(task=task, group_index=within % run.group_size, agent=agent)
        )
        rollout = Rollout(execution_id=result.execution_id, group=f"{step}/{task.id}", reward=result.reward,
                          records=result.records, dropped=not result.trainable)  # fmt: skip
        rollouts[step].append(rollout)
        return rollout

    def on_step(step: int, trained: StepMetrics) -> None:  # journaled before the loop goes on
        kept = [r.reward for r in rollouts[step] if not r.dropped]
        record = StepRecord(
            step=step, wall_s=time.monotonic() - started, reward_mean=statistics.fmean(kept) if kept else 0.0,
            reward_std=statistics.pstdev(kept) if kept else 0.0,
            pass_rate=sum(r >= 1.0 for r in kept) / max(len(kept), 1), executions=len(rollouts[step]),
            dropped=len(rollouts[step]) - len(kept), trainer=trained, at_s=time.time(),
        )  # fmt: skip
        metrics.append(record)
        records.append(record)
        for tag, value in scalars(record).items():
            board.add_scalar(tag, value, step)
        board.flush()

    async with Cluster(cfg, run.model_path, run_dir) as cluster:
        runtime = Runtime(cluster.router, cfg.sandbox, str(journal), verifier=Verifier(cfg.sandbox))
        try:
            books = Books(batch, run.burst_steps, run.steps)
            loop = ElasticLoop(cluster.controller, cfg.controller, books, run.group_size, execute,
                               group_micro_steps(cfg.trajectory, batch), on_step=on_step)  # fmt: skip
            async with asyncio.TaskGroup() as group:
                shown = (
                    group.create_task(view.show(cluster.controller, books, records, started))
                    if live
                    else None
                )
                result = await loop.run()
                if shown is not None:
                    shown.cancel()
        finally:
            await runtime.aclose()
            metrics.close()
            board.close()
    means = [
        statistics.fmean(r.reward for r in rollouts[s]) if rollouts[s] else 0.0 for s in range(run.steps)
    ]
    summary = TrainSummary(run_dir=str(run_dir), mode=cfg.controller.mode, steps=len(result.steps),
                           total_s=result.total_s, idle_fraction=result.idle_fraction,
                           switches=len(result.switches), failed_executions=result.failed_executions,
                           reward_first=means[0], reward_last=means[-1])  # fmt: skip
    (run_dir / "train.json").write_bytes(msgspec.json.format(msgspec.json.encode(summary)))
    write_report(run_dir)
    return summary


def scalars(record: StepRecord) -> dict[str, float]:
    """A step's figures as TensorBoard scalars (tag -> value)."""
    t = record.trainer
    return {
        "reward/mean": record.reward_mean, "reward/std": record.reward_std, "reward/pass_rate": record.pass_rate,
        "executions/dropped": record.dropped, "train/loss": t.loss, "train/grad_norm": t.grad_norm,
        "train/entropy": t.entropy, "train/kl": t.kl, "train/clip_fraction": t.clip_fraction,
        "train/ratio_mean": t.ratio_mean, "train/lr": t.lr, "train/tokens": t.tokens,
        "train/computed_tokens": t.computed_tokens, "train/staleness_mean": t.staleness_mean,
        "time/step_s": t.seconds, "time/wall_s": record.wall_s,
    }  # fmt: skip


def _board(run_dir: Path) -> Any:
    """A TensorBoard event writer in ``run_dir/tensorboard`` (``tensorboard --logdir`` opens it)."""
    from tensorboardX import SummaryWriter

    return SummaryWriter(str(run_dir / "tensorboard"))

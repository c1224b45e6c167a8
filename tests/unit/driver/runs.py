"""A run directory as `gyre train` journals it: steps, executions, switches, evals and the driver's timeline.

Three cells; each step samples 16 s with every cell serving, then cell ``step % 2`` switches to training for the
update and back. Every line is of the type its writer journals (the driver's, the runtime's, the controller's).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Literal

from gyre.control.loop import LoopSample
from gyre.driver.training import EvalPoint, StepRecord
from gyre.journal import Journal
from gyre.protocol import StepMetrics, SwitchRecord
from gyre.runtime.dispatch import ExecutionResult, ExecutionStatus
from gyre.tasks.verify import Verdict

START_S = 1_760_000_000.0  # wall clock of the run's start
STEP_S = 20.0
SAMPLE_S = 16.0  # of each step, the sampling; then the switch to training, the update and the switch back
CELLS = 3
GROUP = 4
TASKS_PER_STEP = 2
EVAL_AFTER = (0, 3, 6)  # steps applied when the held-out set was evaluated (0: the base model)
PLOTS = [  # the plots of a whole run's report, in order
    "Reward per step",
    "Partial-score distribution per step",
    "Held-out eval (95% interval)",
    "Cell roles over time",
    "Cells by role, utilisation and idle",
    "Water level: executions in flight",
    "Switch durations by phase",
    "Tokens sampled vs trained per step",
    "Staleness and loss per step",
]


def metrics(step: int, staleness: float = 0.5) -> StepMetrics:
    """The trainer's figures of one step."""
    return StepMetrics(step=step, version=step + 1, loss=0.1, tokens=100, computed_tokens=400, micro_steps=2,
                       clip_fraction=0.0, truncated_fraction=0.0, ratio_mean=1.0, ratio_std=0.0, ratio_min=1.0,
                       ratio_max=1.0, entropy=2.0, kl=0.0, grad_norm=0.5, lr=1e-4, staleness_mean=staleness,
                       staleness_max=round(staleness + 0.5), seconds=1.5, by_member={"core": 2}, discarded=0,
                       reclaimed=0)  # fmt: skip


def execution(
    execution_id: str, step: int, reward: float, status: ExecutionStatus = "done"
) -> ExecutionResult:
    """A finished execution of ``step``'s sampling, scored ``reward`` (crashed ones are dropped)."""
    begin = START_S + step * STEP_S
    verdict = Verdict(outcome="scored" if status == "done" else "dropped", score=reward)
    return ExecutionResult(execution_id=execution_id, task_id=f"task-{step}", group_index=0, status=status,
                           agent=None, error=None if status == "done" else "agent crashed", records=[],
                           prompt_tokens=300, completion_tokens=120, dispatched_s=begin + 0.5,
                           started_s=begin + 1.0, finished_s=begin + SAMPLE_S - 1.0, verdict=verdict,
                           reward=reward)  # fmt: skip


def write_run(run_dir: Path, steps: int = 6) -> Path:
    """Journal a run of ``steps`` applied steps (one execution of the last crashed) into ``run_dir``."""
    rng = random.Random(0)
    executions = Journal(run_dir / "journal", "executions.jsonl")
    metrics_file = Journal(run_dir, "metrics.jsonl")
    switches = Journal(run_dir, "switches.jsonl")
    for k in range(steps):
        trained = []
        for n in range(GROUP * TASKS_PER_STEP):  # partial scores that improve with training
            result = execution(f"e{k}-{n}", k, min(1.0, rng.choice([0.0, 0.25, 0.5, 0.75]) + 0.05 * k))
            executions.append(result)
            trained.append(result)
        if k == steps - 1:
            executions.append(execution(f"e{k}-crashed", k, 0.0, status="crashed"))
        rewards = [r.reward for r in trained]
        mean = sum(rewards) / len(rewards)
        record = StepRecord(step=k, wall_s=(k + 1) * STEP_S, reward_mean=mean,
                            reward_std=(sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5,
                            pass_rate=sum(r >= 1.0 for r in rewards) / len(rewards),
                            executions=len(trained) + (k == steps - 1), dropped=int(k == steps - 1),
                            trainer=metrics(k, staleness=0.25 * (k % 3)),
                            at_s=START_S + (k + 1) * STEP_S, execution_ids=[r.execution_id for r in trained],
                            sampled_tokens=sum(r.completion_tokens for r in trained))  # fmt: skip
        metrics_file.append(record)
        turns: list[tuple[Literal["serve_to_train", "train_to_serve"], float]] = [
            ("serve_to_train", SAMPLE_S), ("train_to_serve", SAMPLE_S + 2)]  # fmt: skip
        for n, (direction, at) in enumerate(turns):
            switches.append(SwitchRecord(switch=2 * k + n + 1, cell=f"cell-{k % 2}", direction=direction,
                                         started=START_S + k * STEP_S + at, total_s=1.0,
                                         phases={"drain": 0.5, "release": 0.2, "load": 0.3}))  # fmt: skip
    evals = Journal(run_dir, "eval.jsonl")
    for after in (a for a in EVAL_AFTER if a <= steps):
        mean = 0.3 + 0.05 * after
        evals.append(EvalPoint(step=after, version=after, mean=mean, ci_low=mean - 0.08, ci_high=mean + 0.08,
                               pass_rate=mean / 3, executions=32, at_s=START_S + after * STEP_S + 0.5))  # fmt: skip
    timeline = Journal(run_dir, "timeline.jsonl")
    for second in range(int(steps * STEP_S)):
        within = second % STEP_S  # 0-15 sampling (the water level falls), 16 and 18 switching, 17 training
        role = {SAMPLE_S: "switching", SAMPLE_S + 1: "training", SAMPLE_S + 2: "switching"}.get(within)
        sampling = within < SAMPLE_S
        timeline.append(LoopSample(
            at_s=START_S + second + 0.2, in_flight=8 - int(within // 2) if sampling else 0,
            ready=int(within // 2) if sampling else 0, serving=CELLS - (role is not None),
            training=int(role == "training"), switching=int(role == "switching"),
            idle_cells=0.0 if within < SAMPLE_S / 2 else 1.0, cells=CELLS, version=second // int(STEP_S),
        ))  # fmt: skip
    for journal in (executions, metrics_file, switches, evals, timeline):
        journal.close()
    return run_dir

"""`gyre quickstart`: an agent that gets better because Gyre trained it, on a laptop's CPU (issue 13).

The recipe, every phase a real Gyre command on the tiny model and the ``toy`` suite, the built-in agent's lean
profile (bash and submit, a one-line prompt) throughout so demonstrations, evaluations and training see one prompt:

1. demonstrations: the scripted expert solves ``DEMO_SUITE`` through the real stack (`gyre eval --agent oracle`);
2. the untrained model on the fixed held-out set ``EVAL_SUITE`` (`gyre eval`): the floor;
3. `gyre sft` twice: first windows ending at each name the expert copied from a tool result, the loss on the name
   (``window_focus = ["copied"]``, no epochs: the model learns to copy), then windows on whole outputs and copies
   (the call format) and one epoch over whole sessions (it carries both to the long context). Why this and not
   whole sessions from the start: BENCHMARKS.md, "Quickstart";
4. `gyre train` (elastic, 2 cells) from the SFT checkpoint, its weights and its AdamW moments
   (``trainer.optimizer_from``), evaluating the same held-out set before its first step and after its last.

Everything lands in one directory: ``demos/``, ``eval-base/``, ``sft-copy/``, ``sft/``, ``train/`` (its report has
the learning curve) and ``quickstart.json`` (the three evaluations with their 95% intervals and each phase's
seconds).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import msgspec

from gyre.config import GyreConfig, load_config
from gyre.evaluation import EvalOptions, run_eval
from gyre.journal import read_journal
from gyre.loop import run as run_loop
from gyre.models import init_model
from gyre.rundir import default_run_dir
from gyre.sft import run_sft
from gyre.training import EvalPoint, train

DEMO_SUITE = "toy:400:100"
EVAL_SUITE = "toy:32:7"
TRAIN_SUITE = "toy:256:1"
# Window steps of the first SFT stage (copying emerged at ~170-190 steps in the runs BENCHMARKS.md shows).
COPY_STEPS = 200
TRAIN_TEMPERATURE = 0.5  # RL samples at it (the trainer takes log-probabilities at it too)
# The held-out evaluations sample near the policy's mode, as a user would run the trained agent.
EVAL_TEMPERATURE = 0.3


class Point(msgspec.Struct, frozen=True, kw_only=True):
    """One evaluation of the held-out set."""

    phase: str  # base | sft | rl
    mean: float
    ci_low: float
    ci_high: float
    pass_rate: float


class QuickstartSummary(msgspec.Struct, frozen=True, kw_only=True):
    """``quickstart.json``."""

    run_dir: str
    points: list[Point]
    seconds: dict[str, float]  # phase -> wall seconds
    total_s: float


def recipe(run_dir: Path, model_path: str, short: bool = False) -> GyreConfig:
    """The configuration of the second SFT stage and the RL phase; `copy_stage` derives the first SFT stage from
    it. ``short``: a CI-sized version that still has to learn the call format (no copy stage, fewer steps)."""

    def quoted(value: object) -> str:  # a TOML string, whatever the path holds
        return json.dumps(str(value))

    start = run_dir / "sft-copy" / "checkpoints" / f"step-{COPY_STEPS}" if not short else model_path
    overrides = [
        f"sft.model_path={quoted(start)}", f"sft.journals=[{quoted(run_dir / 'demos')}]",
        f"sft.output_dir={quoted(run_dir / 'sft')}", "sft.window_tokens=384", 'sft.window_focus=["output", "copied"]',
        f"sft.window_steps={80 if short else 100}", "sft.window_batch=32", "sft.learning_rate=3e-3",
        "sft.lr_warmup_steps=5", "sft.batch_sessions=8", f"sft.epochs={3 if short else 1}", "trainer.num_threads=2",
        f'run.suite="{TRAIN_SUITE}"', f"run.run_dir={quoted(run_dir / 'train')}", f"run.steps={1 if short else 6}",
        "run.tasks_per_step=8", "run.group_size=4", 'run.agent_profile="lean"', "run.agent_max_calls=16",
        "run.agent_max_tokens=128", f"run.agent_temperature={TRAIN_TEMPERATURE}", f'run.eval_suite="{EVAL_SUITE}"',
        f"run.eval_tasks={8 if short else 0}", f"run.eval_temperature={EVAL_TEMPERATURE}",
        "cells.count=2", "cells.capacity_executions=16", "cells.num_threads=1",
        'cells.engine_overrides=["engine.kv_cache_mem_gib=0.5"]', "trainer.learning_rate=1e-3",
    ]  # fmt: skip
    return load_config(None, overrides)


def copy_stage(cfg: GyreConfig, model_path: str, run_dir: Path) -> GyreConfig:
    """The first SFT stage: windows on the names the expert copied, no epochs, from the untrained model."""
    sft = msgspec.structs.replace(cfg.sft, model_path=model_path, output_dir=str(run_dir / "sft-copy"),
                                  window_focus=["copied"], window_steps=COPY_STEPS, lr_warmup_steps=10,
                                  epochs=0)  # fmt: skip
    return msgspec.structs.replace(cfg, sft=sft)


def quickstart(run_dir: str | Path | None = None, model_path: str = "models/tiny", short: bool = False,
               progress: bool = True) -> QuickstartSummary:  # fmt: skip
    """Run the recipe (see the module) into ``run_dir``; returns the three evaluations."""
    root = Path(run_dir or default_run_dir("quickstart", "toy")).absolute()
    root.mkdir(parents=True, exist_ok=True)
    if not (Path(model_path) / "config.json").exists():
        init_model(model_path, preset="tiny")
    seconds: dict[str, float] = {}
    started = time.monotonic()

    def timed(phase: str, since: float) -> None:
        seconds[phase] = time.monotonic() - since

    t = time.monotonic()
    demos = EvalOptions(suite=DEMO_SUITE if not short else "toy:160:100", run_dir=str(root / "demos"),
                        agent="oracle", agent_profile="lean", model_path=model_path, concurrency=16,
                        progress=progress)  # fmt: skip
    demonstrated = run_eval(demos)
    if not demonstrated.ok:  # SFT on broken demonstrations would teach the breakage
        raise RuntimeError(
            "the expert's demonstrations are not clean: " + "; ".join(demonstrated.problems[:5])
        )
    timed("demonstrations", t)
    t = time.monotonic()
    cfg = recipe(root, model_path, short)
    # the base point is scored as `gyre train` scores the other two: same set, call limits and temperature
    run = cfg.run
    temperature = run.agent_temperature if run.eval_temperature is None else run.eval_temperature
    base = run_eval(EvalOptions(suite=run.eval_suite, limit=run.eval_tasks, run_dir=str(root / "eval-base"),
                                agent_profile=run.agent_profile, model_path=model_path, max_steps=run.agent_max_calls,
                                max_tokens_per_call=run.agent_max_tokens, concurrency=16, temperature=temperature,
                                progress=progress))  # fmt: skip
    timed("base eval", t)
    t = time.monotonic()
    if not short:
        run_sft(copy_stage(cfg, model_path, root), progress=progress)
    sft = run_sft(cfg, progress=progress)
    timed("sft", t)
    # RL starts from SFT's weights and AdamW moments: a fresh Adam's first updates (every weight moved by about the
    # learning rate) broke the call format at 1e-3 (BENCHMARKS.md, "Quickstart")
    cfg = msgspec.structs.replace(cfg, run=msgspec.structs.replace(cfg.run, model_path=sft.checkpoint),
                                  trainer=msgspec.structs.replace(cfg.trainer, optimizer_from=sft.checkpoint))  # fmt: skip
    t = time.monotonic()
    trained = run_loop(train(cfg))
    timed("rl", t)
    evals = sorted(read_journal(Path(trained.run_dir) / "eval.jsonl", EvalPoint), key=lambda e: e.step)
    points = [Point(phase="base", mean=base.mean_score, ci_low=base.mean_ci[0], ci_high=base.mean_ci[1],
                    pass_rate=base.pass_rate)]  # fmt: skip
    points += [Point(phase=phase, mean=e.mean, ci_low=e.ci_low, ci_high=e.ci_high, pass_rate=e.pass_rate)
               for phase, e in (("sft", evals[0]), ("rl", evals[-1]))]  # fmt: skip
    summary = QuickstartSummary(run_dir=str(root), points=points, seconds=seconds,
                                total_s=time.monotonic() - started)  # fmt: skip
    (root / "quickstart.json").write_bytes(msgspec.json.format(msgspec.json.encode(summary)))
    return summary

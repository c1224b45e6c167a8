"""Where the wall time of a short `gyre train` goes, phase by phase, in each mode (elastic, async, colocate).

    python benchmarks/train_phases.py [--steps 3] [--tasks 4] [--group 2] [--cells 2] [--bare]

Runs `gyre.driver.training.train` on the tiny model and the ``toy`` suite (the built-in agent, a few short calls each) with
the same cells in each mode, on modelled devices by default (each engine step lasts ``--step-s``, each trainer
computes at most ``--train-tps`` tokens a second, each weight push takes ``--push-s``: cells then do not compete for
this machine's 2 cores, as separate accelerators would not; ``--bare`` turns them off). Then reads each run directory:

- cell time (cells x wall, from ``timeline.jsonl``, a sample a second): **sampling** (serving slots with an
  execution), **training** (training cells holding micro-steps), **switching** (draining or resuming), **idle** (the
  rest); these four add up to 100%;
- **verification**: share of the wall time during which at least one execution was being scored (its verdict's
  duration, which ends when the execution finishes; verification runs in the driver's sandboxes, not on cells);
- **weight sync**: seconds the core spent pushing weights to serving engines (summed over engines, from the core's
  statistics), as a share of the wall time.

Prints the table and writes ``benchmarks/results/train_phases.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gyre.config import load_config
from gyre.control.loop import LoopSample
from gyre.driver.rundir import RunDir
from gyre.driver.training import TrainSummary, train
from gyre.engine.models import init_model
from gyre.journal import read_journal
from gyre.runtime.dispatch import ExecutionResult

RESULTS = Path(__file__).parent / "results"
MODES = ("elastic", "async", "colocate")


def config_overrides(args: argparse.Namespace, model: Path, run_dir: Path, mode: str) -> list[str]:
    engine = ["engine.kv_cache_mem_gib=0.2"] + (
        [] if args.bare else [f"engine.modelled_step_s={args.step_s}"]
    )
    out = [f"run.model_path={json.dumps(str(model))}", f"run.run_dir={json.dumps(str(run_dir))}",
           f"run.steps={args.steps}", f"run.tasks_per_step={args.tasks}", f"run.group_size={args.group}",
           'run.suite="toy:16"', "run.agent_max_calls=3", "run.agent_max_tokens=24", f"controller.mode={mode!r}",
           f"cells.count={args.cells}", f"cells.capacity_executions={args.capacity}", "cells.num_threads=1",
           f"cells.engine_overrides={json.dumps(engine)}", "trainer.learning_rate=1e-4", "trainer.heartbeat_s=0.25",
           "controller.heartbeat_s=0.25"]  # fmt: skip
    if not args.bare:
        out += [f"trainer.modelled_tokens_per_s={args.train_tps}", f"trainer.modelled_push_s={args.push_s}"]
    return out


def phases(rd: RunDir, summary: TrainSummary) -> dict[str, float]:
    """Shares of the run's time per phase (see the module)."""
    samples = list(read_journal(rd.timeline, LoopSample))
    if len(samples) < 2:
        raise SystemExit(f"{rd.timeline}: too few samples to measure")
    wall = samples[-1].at_s - samples[0].at_s
    cell_s = {"sampling": 0.0, "training": 0.0, "switching": 0.0, "idle": 0.0}
    for a, b in itertools.pairwise(samples):
        dt = b.at_s - a.at_s
        cell_s["sampling"] += a.sampling * dt
        cell_s["training"] += a.computing * dt
        cell_s["switching"] += a.switching * dt
        cell_s["idle"] += max(a.cells - a.sampling - a.computing - a.switching, 0.0) * dt
    total = sum(cell_s.values()) or 1.0
    shares = {k: v / total for k, v in cell_s.items()}
    verifying = sorted(
        (e.finished_s - e.verdict.duration_s, e.finished_s)
        for e in read_journal(rd.executions, ExecutionResult)
        if e.verdict is not None
    )
    shares["verification"] = union(verifying, samples[0].at_s, samples[-1].at_s) / wall
    shares["weight_sync"] = (samples[-1].push_total_s - samples[0].push_total_s) / wall
    shares["wall_s"] = summary.total_s
    shares["idle_fraction"] = summary.idle_fraction
    return shares


def union(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] covered by any of the sorted ``intervals``."""
    covered, reach = 0.0, start
    for a, b in intervals:
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered += b - a
            reach = b
    return covered


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=4, help="tasks per step")
    parser.add_argument("--group", type=int, default=2, help="executions per task")
    parser.add_argument("--cells", type=int, default=2)
    parser.add_argument("--capacity", type=int, default=4, help="executions per serving cell")
    parser.add_argument("--step-s", type=float, default=0.02, help="modelled engine step (seconds)")
    parser.add_argument("--train-tps", type=float, default=1500.0, help="modelled trainer tokens per second")
    parser.add_argument("--push-s", type=float, default=0.5, help="modelled weight push (seconds per engine)")
    parser.add_argument("--bare", action="store_true", help="no modelled devices: cells share the CPU")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    console = Console(width=140)
    results: dict[str, Any] = {"args": vars(args), "modes": {}}
    with tempfile.TemporaryDirectory(prefix="gyre-bench-phases-") as tmp:
        model = Path(tmp) / "tiny"
        init_model(model)
        for mode in MODES:
            run_dir = Path(tmp) / mode
            cfg = load_config(None, config_overrides(args, model, run_dir, mode))
            console.print(
                f"[bold]{mode}[/]: {args.steps} steps of {args.tasks} x {args.group} executions ..."
            )
            summary = asyncio.run(train(cfg))
            results["modes"][mode] = phases(RunDir(run_dir), summary)
    table = Table(
        title="gyre train: share of time per phase (cell time; verification and weight sync: of wall)"
    )
    for column in (
        "mode",
        "wall s",
        "sampling",
        "training",
        "switching",
        "idle",
        "verification",
        "weight sync",
    ):
        table.add_column(column, justify="right")
    for mode, r in results["modes"].items():
        table.add_row(mode, f"{r['wall_s']:.1f}", *(f"{r[k]:.0%}" for k in ("sampling", "training", "switching",
                                                                             "idle", "verification", "weight_sync")))  # fmt: skip
    console.print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "train_phases.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

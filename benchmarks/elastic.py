"""Real cells on this machine: role-switch times per phase, and the three modes side by side at equal cell budget.

    python benchmarks/elastic.py [--cells 3] [--steps 3] [--tasks 4] [--group 2] [--cycles 8] [--skip-modes]

1. Switches: a core, a satellite and a standalone server under the load of built-in agents on the ``toy`` suite;
   ``--cycles`` times serve -> train -> serve of both trainable cells. Median and worst seconds per phase, against
   the targets (serve -> train <= 2 s, train -> serve <= 1 s; published at 2.4T scale: 8.52 s and 3.46 s).
2. Modes: ``--cells`` cells (the core and satellites), the ``toy`` suite run by the built-in agent (a few short
   calls) with a heavy-tailed modelled tool latency (lognormal per execution, p99/p50 = ``--tail``, 10), ``--steps`` steps of
   ``--tasks`` x ``--group`` executions, in elastic (overlap), async (one training cell) and colocate; twice: on
   the bare CPU (every cell shares 2 cores) and on modelled devices (each engine step lasts ``--step-s``, each
   trainer computes ``--train-tps`` tokens a second at most, so cells do not compete for the CPU). Time for the
   steps, idle fraction, switches, agent-visible errors; target (modelled): elastic >= 1.3x faster than the better
   baseline.

Writes ``benchmarks/results/elastic.json`` and the role timeline of each run to ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gyre.agents.toolagent import BuiltinAgentConfig
from gyre.config import ControllerConfig, load_config
from gyre.control.books import Books
from gyre.control.cluster import Cluster
from gyre.control.loop import ElasticLoop, LoopResult, group_micro_steps
from gyre.engine.models import init_model
from gyre.protocol import MicroStep
from gyre.runtime.dispatch import BuiltinAgentSpec, ExecutionSpec, Runtime
from gyre.sim import Cluster as SimCluster
from gyre.sim import SimResult, Tasks, Trace, Workload, simulate
from gyre.tasks.toy import toy_suite
from gyre.train.step import Rollout

RESULTS = Path(__file__).parent / "results"
console = Console(width=max(Console().width, 140))  # a whole table in a log, not cut to 80


def overrides(args: argparse.Namespace, cells: int, standalone: int, modelled: bool) -> list[str]:
    out = [f"cells.count={cells}", f"cells.standalone={standalone}", f"cells.capacity_executions={args.capacity}",
           "cells.engine_overrides=['engine.kv_cache_mem_gib=0.2']", "cells.num_threads=1",
           "trainer.learning_rate=1e-4", "trainer.heartbeat_s=0.25", "controller.heartbeat_s=0.25",
           "router.wait_for_engine_s=600",
           # the untrained model scores alike in every group; what is timed is training as a learning run pays it
           "trajectory.skip_zero_advantage=false"]  # fmt: skip
    if modelled:
        out[3] = (
            f"cells.engine_overrides=['engine.kv_cache_mem_gib=0.2', 'engine.modelled_step_s={args.step_s}']"
        )
        out.append(f"trainer.modelled_tokens_per_s={args.train_tps}")
    return out


def agent(args: argparse.Namespace, rng: random.Random) -> BuiltinAgentSpec:
    """The built-in agent, short, with this execution's modelled tool latency (heavy-tailed across executions)."""
    sigma = math.log(args.tail) / 2.3263  # p99 / p50 of the lognormal
    latency = min(rng.lognormvariate(math.log(args.tool_s), sigma), 20 * args.tool_s)
    return BuiltinAgentSpec(config=BuiltinAgentConfig(max_steps=args.calls, max_tokens_per_call=args.tokens,
                                                      delegation=False, modelled_tool_latency_s=latency))  # fmt: skip


async def switch_times(args: argparse.Namespace, model: Path, work: Path) -> dict[str, Any]:
    cfg = load_config(None, overrides(args, 2, 1, modelled=False))
    tasks = toy_suite(64, seed=1)
    async with Cluster(cfg, model, work / "switches") as cluster:
        runtime = Runtime(cluster.router, verifier=False)
        stop = asyncio.Event()
        rng = random.Random(0)

        async def load(i: int) -> None:
            while not stop.is_set():
                await runtime.run_one(ExecutionSpec(task=tasks[i % len(tasks)], agent=agent(args, rng)))

        async with asyncio.TaskGroup() as group:
            for i in range(args.load):
                group.create_task(load(i))
            await asyncio.sleep(3.0)  # the agents are mid-call
            for _ in range(args.cycles):
                await cluster.controller.to_train("cell-0")
                await cluster.controller.to_train("cell-1")
                await cluster.controller.to_serve("cell-1")
                await cluster.controller.to_serve("cell-0")
            stop.set()
        crashed = runtime.statistics().by_status.get("crashed", 0)
        await runtime.aclose()
    out: dict[str, Any] = {"crashed": crashed}
    for direction in ("serve_to_train", "train_to_serve"):
        records = [r for r in cluster.controller.records if r.direction == direction]
        phases = {p: [r.phases[p] for r in records] for p in records[0].phases}
        out[direction] = {
            "total_median_s": statistics.median(r.total_s for r in records),
            "total_max_s": max(r.total_s for r in records),
            "phases_median_s": {p: statistics.median(v) for p, v in phases.items()},
            "phases_max_s": {p: max(v) for p, v in phases.items()},
            "moved_calls": sum(r.moved_calls for r in records),
            "switches": len(records),
        }
    return out


async def one_mode(args: argparse.Namespace, model: Path, work: Path, policy: ControllerConfig,
                   modelled: bool) -> tuple[LoopResult, int, list[float]]:  # fmt: skip
    """The live run, its crashed executions, and each execution's share of the micro-steps its group built (the
    first member holds the group's first micro-step, and so on; the others none), in computed tokens."""
    cfg = load_config(None, overrides(args, args.cells, 0, modelled))
    tasks = toy_suite(args.tasks * args.steps, seed=2)
    batch = args.tasks * args.group
    name = f"{policy.mode}-{'modelled' if modelled else 'cpu'}"
    async with Cluster(cfg, model, work / name) as cluster:
        runtime = Runtime(cluster.router, verifier=None)
        rng = random.Random(3)
        agents = [agent(args, rng) for _ in range(batch * args.steps)]  # the same draws in every mode
        index_of: dict[str, int] = {}
        tokens = [0.0] * (batch * args.steps)
        build = group_micro_steps(cfg.trajectory, batch, cfg.trainer.loss.kl_coef)

        def recorded(group: list[Rollout], step: int) -> list[MicroStep]:
            micro = build(group, step)
            first = min(
                index_of[r.execution_id] if r.execution_id in index_of else int(r.execution_id[1:])
                for r in group
            )  # (x<i>: the loop's name for an execution that crashed)
            for j, m in enumerate(micro):
                tokens[first + min(j, len(group) - 1)] += len(m.input_ids)
            return micro

        async def execute(index: int) -> Rollout:
            step, within = divmod(index, batch)
            task = tasks[step * args.tasks + within // args.group]
            result = await runtime.run_one(ExecutionSpec(task=task, group_index=within % args.group,
                                                         agent=agents[index]))  # fmt: skip
            index_of[result.execution_id] = index
            return Rollout(execution_id=result.execution_id, group=f"{step}/{task.id}", reward=result.reward,
                           records=result.records, dropped=not result.trainable)  # fmt: skip

        loop = ElasticLoop(
            cluster.controller, policy, Books(batch, 1, args.steps), args.group, execute, recorded
        )
        result = await loop.run()
        crashed = runtime.statistics().by_status.get("crashed", 0)
        await runtime.aclose()
    return result, crashed, tokens


def timeline(result: LoopResult, path: Path) -> None:
    """Each cell's switches over the run, as a PNG (a bar per switch, coloured by direction)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not result.switches:
        return
    start = min(s.started for s in result.switches)
    cells = sorted({s.cell for s in result.switches})
    fig, ax = plt.subplots(figsize=(10, 1 + 0.5 * len(cells)))
    for s in result.switches:
        color = "tab:orange" if s.direction == "serve_to_train" else "tab:blue"
        ax.barh(cells.index(s.cell), max(s.total_s, 0.05), left=s.started - start, color=color)
    ax.set_yticks(range(len(cells)), cells)
    ax.set_xlabel("seconds (orange: to training, blue: to serving)")
    ax.set_title(f"{result.mode}: {len(result.switches)} switches, steps at " +
                 ", ".join(f"{t:.0f}" for t in result.step_end_s) + " s")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def replayed(args: argparse.Namespace, result: LoopResult, policy: ControllerConfig, tokens: list[float]
             ) -> SimResult:  # fmt: skip
    """The live run's own executions (their measured durations) through the simulator, under the same policy, with
    the costs measured live: switches (median per direction), micro-steps as the run built them (a group's, at the
    tokens the modelled device computes, prompts included, at ``--train-tps``), the update and push (the core's
    push seconds per step, plus 0.05 s)."""
    batch = args.tasks * args.group
    medians = {d: statistics.median([s.total_s for s in result.switches if s.direction == d] or [0.0])
               for d in ("serve_to_train", "train_to_serve")}  # fmt: skip
    micro = [t / args.train_tps for t in tokens]
    workload = Workload(
        cluster=SimCluster(cells=args.cells, capacity=args.capacity, micro_step_s=max(statistics.mean(micro), 1e-3),
                           apply_s=result.push_s / max(len(result.steps), 1) + 0.05,  # (micro_step_s: unused, the trace has them)
                           serve_to_train_s=medians["serve_to_train"], train_to_serve_s=medians["train_to_serve"]),
        tasks=Tasks(steps=args.steps, batch_executions=batch, group_size=args.group, budget_s=1e9),
        trace=Trace(durations_s=[end - begin for begin, end in result.spans], micro_steps_s=micro),
    )  # fmt: skip
    return simulate(workload, policy)


async def modes(args: argparse.Namespace, model: Path, work: Path) -> dict[str, Any]:
    policies = {
        "elastic": ControllerConfig(mode="elastic", overlap=True, max_staleness=1),
        "elastic + carry-over": ControllerConfig(
            mode="elastic", overlap=True, max_staleness=1, carry_over=True
        ),
        "async": ControllerConfig(mode="async", async_train_cells=1, max_staleness=1),
        "one-step": ControllerConfig(mode="onestep", async_train_cells=1, max_staleness=1),
        "colocate": ControllerConfig(mode="colocate"),
    }
    out: dict[str, Any] = {}
    for modelled in [d == "modelled" for d in args.devices.split(",")]:
        device = "modelled" if modelled else "cpu"
        table = Table(title=f"{args.steps} steps x {args.tasks * args.group} executions on {args.cells} cells "
                            f"({'modelled devices' if modelled else 'bare CPU, shared'})")  # fmt: skip
        for col in ("mode", "seconds", "vs elastic", "simulated s", "live / sim", "idle (sim)", "switches (sim)",
                    "agent errors", "staleness"):  # fmt: skip
            table.add_column(col, justify="right")
        rows = {}
        for mode, policy in policies.items():
            result, crashed, tokens = await one_mode(args, model, work, policy, modelled)
            timeline(result, RESULTS / f"elastic-{mode.replace(' ', '')}-{device}.png")
            sim = replayed(args, result, policy, tokens)
            rows[mode] = {"seconds": result.total_s, "idle": result.idle_fraction,
                          "switches": len(result.switches), "agent_errors": crashed + result.failed_executions,
                          "staleness_mean": result.staleness_mean, "step_end_s": result.step_end_s,
                          "simulated_s": sim.total_s, "simulated_idle": sim.idle_fraction,
                          "simulated_switches": sim.switches, "simulated_step_end_s": sim.step_end_s,
                          "spans": result.spans, "step_tokens": [m.computed_tokens for m in result.steps],
                          "step_seconds": [m.seconds for m in result.steps], "push_s": result.push_s}  # fmt: skip
        for mode, row in rows.items():
            table.add_row(mode, f"{row['seconds']:.1f}", f"{row['seconds'] / rows['elastic']['seconds']:.2f}x",
                          f"{row['simulated_s']:.1f}", f"{row['seconds'] / row['simulated_s']:.2f}",
                          f"{row['idle']:.0%} ({row['simulated_idle']:.0%})",
                          f"{row['switches']} ({row['simulated_switches']})", str(row["agent_errors"]),
                          f"{row['staleness_mean']:.2f}")  # fmt: skip
        console.print(table)
        best = min(rows["async"]["seconds"], rows["colocate"]["seconds"], rows["one-step"]["seconds"])
        speedup = best / rows["elastic"]["seconds"]
        live_order = sorted(rows, key=lambda m: rows[m]["seconds"])
        sim_order = sorted(rows, key=lambda m: rows[m]["simulated_s"])
        worst = max(abs(r["seconds"] / r["simulated_s"] - 1) for r in rows.values())
        console.print(f"{device}: elastic is {speedup:.2f}x the better baseline" +
                      (" (target >= 1.3x)" if modelled else "") +
                      f"; live within {worst:.1%} of the simulator on each run's own executions (target 10%); "
                      f"order live {' < '.join(live_order)}, simulated {' < '.join(sim_order)}")  # fmt: skip
        out[device] = {"modes": rows, "speedup_over_better_baseline": speedup, "live_vs_sim_worst": worst,
                       "order_live": live_order, "order_sim": sim_order}  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", type=int, default=3, help="cells that serve and train, in the modes part")
    parser.add_argument("--capacity", type=int, default=4, help="executions a serving cell hosts")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=4, help="tasks per step")
    parser.add_argument("--group", type=int, default=2, help="executions per task")
    parser.add_argument(
        "--calls", type=int, default=3, help="model calls per execution (the agent's max_steps)"
    )
    parser.add_argument("--tokens", type=int, default=24, help="max tokens per call")
    parser.add_argument("--tool-s", type=float, default=1.0, help="median modelled tool latency per call")
    parser.add_argument(
        "--tail", type=float, default=10.0, help="p99/p50 of the tool latency across executions"
    )
    parser.add_argument("--step-s", type=float, default=0.05, help="modelled engine step time")
    parser.add_argument("--train-tps", type=float, default=4000.0, help="modelled trainer tokens per second")
    parser.add_argument("--cycles", type=int, default=8, help="serve -> train -> serve cycles timed")
    parser.add_argument("--load", type=int, default=16, help="agents running while switches are timed")
    parser.add_argument("--skip-modes", action="store_true", help="only time the switches")
    parser.add_argument("--skip-switches", action="store_true", help="only compare the modes")
    parser.add_argument("--devices", default="modelled,cpu", help="modelled, cpu or both (comma-separated)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gyre-bench-elastic-") as tmp:
        work = Path(tmp)
        model = init_model(work / "tiny", preset="tiny", seed=0)
        started = time.monotonic()
        out: dict[str, Any] = {"args": vars(args)}
        if not args.skip_switches:
            out["switches"] = report_switches(args, asyncio.run(switch_times(args, model, work)))
        if not args.skip_modes:
            out["modes"] = asyncio.run(modes(args, model, work))
        out["wall_s"] = time.monotonic() - started
    name = "elastic.json" if not args.skip_switches and not args.skip_modes else "elastic-partial.json"
    (RESULTS / name).write_text(json.dumps(out, indent=2))
    console.print(f"wrote {RESULTS / name} ({out['wall_s']:.0f} s)")


def report_switches(args: argparse.Namespace, switches: dict[str, Any]) -> dict[str, Any]:
    """Print the switch table."""
    table = Table(title=f"Role switches under load ({args.load} agents), tiny model, {args.cycles} cycles")
    for col in ("direction", "median s", "worst s", "target", "phases (median s)"):
        table.add_column(col, justify="right")
    for direction, target in (("serve_to_train", "<= 2 s"), ("train_to_serve", "<= 1 s")):
        d = switches[direction]
        table.add_row(direction.replace("_", " "), f"{d['total_median_s']:.3f}", f"{d['total_max_s']:.3f}",
                      target, ", ".join(f"{p} {v:.3f}" for p, v in d["phases_median_s"].items()))  # fmt: skip
    console.print(table)
    console.print(f"calls moved by drains: {switches['serve_to_train']['moved_calls']}; "
                  f"executions crashed: {switches['crashed']}")  # fmt: skip
    return switches


if __name__ == "__main__":
    main()

"""Elastic against the baselines a user would run, on every shipped workload, over several seeds (``gyre sim``).

    python benchmarks/sim.py [--workloads paper,growing,bursty,moving,learning,short,agentic,longtail] [--seeds 5]
        [--max-staleness 1]
    python benchmarks/sim.py --solve-rates 0.0-0.6,0.05-0.8,0.2-0.8,0.4-0.9 --out benchmarks/results/solve.json

For each workload and seed: every mode on the same executions, without and with carry-over (a step trains the first
whole groups to finish; the others run on across the update into later steps). Prints, per workload, elastic's
hours and its speed-up over async with the split a user picks (fastest on the first 10% of steps), over the
hindsight oracle split, over one-step off-policy and colocate, its share of the lower bound and its idle time (mean
and range over seeds), against issue 30's targets, and every mode's switches per training stint (issue 48); writes
``benchmarks/results/sim.json`` and ``sim.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.progress import track
from rich.table import Table

from gyre.sim.report import (
    COLOCATE,
    ELASTIC,
    ONESTEP,
    ORACLE,
    USER_ASYNC,
    compare,
    load_workload,
    lower_bound,
    with_seed,
)
from gyre.sim.simulate import Workload

MOVING = {"growing", "bursty", "moving", "learning"}
HEADER = ["workload", "carry-over", "elastic h", "over user's async (no carry)", "over user's async", "over oracle",
          "over one-step", "over colocate", "of the bound", "idle", "token lag"]  # fmt: skip


def measure(name: str, seeds: int, staleness: int, base: Workload | None = None) -> list[dict[str, Any]]:
    """Every seed of one workload (shipped, or ``base`` under that name), without and with carry-over."""
    base = base or load_workload(name)
    rows = []
    for seed in range(seeds):
        workload = with_seed(base, base.tasks.seed + seed)
        plain = compare(workload, staleness)
        for carry in (False, True):
            results = compare(workload, staleness, carry_over=True) if carry else plain
            bound = lower_bound(workload, staleness, carry_over=carry)
            elastic = results[ELASTIC]
            rows.append({
                "workload": name, "seed": seed, "carry_over": carry, "elastic_h": elastic.total_s / 3600,
                "over_user_async_plain": plain[USER_ASYNC].total_s / elastic.total_s,
                "over_user_async": results[USER_ASYNC].total_s / elastic.total_s,
                "over_oracle": results[ORACLE].total_s / elastic.total_s,
                "over_onestep": results[ONESTEP].total_s / elastic.total_s,
                "over_colocate": results[COLOCATE].total_s / elastic.total_s,
                "of_bound": bound.total_s / elastic.total_s, "idle": elastic.idle_fraction,
                "token_lag": elastic.token_lag_mean, "staleness_max": elastic.staleness_max,
                "hours": {mode: r.total_s / 3600 for mode, r in results.items()},
                "per_stint": {mode: r.switches_per_stint for mode, r in results.items()},
                "user_split": results[USER_ASYNC].async_train_cells,
                "oracle_split": results[ORACLE].async_train_cells,
            })  # fmt: skip
    return rows


def summary(rows: list[dict[str, Any]]) -> list[list[str]]:
    """One line per workload and carry-over: mean (min-max) over seeds."""

    def cell(key: str, percent: bool = False) -> str:
        values = [r[key] for r in group]
        form = "{:.0%}" if percent else "{:.2f}x" if key.startswith("over") else "{:.2f}"
        low, high = form.format(min(values)), form.format(max(values))
        return f"{form.format(statistics.mean(values))} ({low}-{high})"

    out = []
    for name in dict.fromkeys(r["workload"] for r in rows):
        for carry in (False, True):
            group = [r for r in rows if r["workload"] == name and r["carry_over"] == carry]
            out.append([name, "yes" if carry else "no", f"{statistics.mean(r['elastic_h'] for r in group):.1f}",
                        cell("over_user_async_plain"), cell("over_user_async"), cell("over_oracle"),
                        cell("over_onestep"), cell("over_colocate"), cell("of_bound", True), cell("idle", True),
                        cell("token_lag")])  # fmt: skip
    return out


def per_stint(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Switches per training stint of every mode, one line per workload and carry-over: the worst seed (issue 48:
    a cell that bounces between roles without training shows here, a target of at most 2)."""
    modes = list(rows[0]["per_stint"])
    out = []
    for name in dict.fromkeys(r["workload"] for r in rows):
        for carry in (False, True):
            group = [r for r in rows if r["workload"] == name and r["carry_over"] == carry]
            out.append([name, "yes" if carry else "no",
                        *(f"{max(r['per_stint'][mode] for r in group):.2f}" for mode in modes)])  # fmt: skip
    return ["workload", "carry-over", *modes], out


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 30's targets, each met or not, on the mean over seeds."""

    def mean(name: str, carry: bool, key: str) -> float:
        return statistics.mean(r[key] for r in rows if r["workload"] == name and r["carry_over"] == carry)

    lines = []
    for name in dict.fromkeys(r["workload"] for r in rows):
        for carry in (False, True):
            label = f"{name}{' + carry-over' if carry else ''}"
            if name.split(" ")[0] in MOVING:
                checks = [("over user's async (no carry)", mean(name, carry, "over_user_async_plain"), 1.3),
                          ("over oracle", mean(name, carry, "over_oracle"), 1.0),
                          ("over colocate", mean(name, carry, "over_colocate"), 2.0),
                          ("busy (1 - idle) >= 90%", 1 - mean(name, carry, "idle"), 0.9)]  # fmt: skip
            else:
                checks = [("within 2% of the oracle", mean(name, carry, "over_oracle"), 0.98)]
            checks.append(("of the bound", mean(name, carry, "of_bound"), 0.95))
            said = ", ".join(f"{what} {value:.2f} ({'met' if value >= target else 'NOT met'})"
                             for what, value, target in checks)  # fmt: skip
            lines.append(f"{label}: {said}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="paper,growing,bursty,moving,learning,short")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--solve-rates", default="",
                        help="instead of --workloads: the learning workload with each solve rate START-END, "
                             "comma-separated (e.g. 0.0-0.6,0.05-0.8)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sim.json")
    args = parser.parse_args()
    console = Console(width=max(Console().width, 160))
    runs: list[tuple[str, Workload | None]] = [(name, None) for name in args.workloads.split(",")]
    if args.solve_rates:
        learning = load_workload("learning")
        runs = []
        for pair in args.solve_rates.split(","):
            start, end = (float(x) for x in pair.split("-"))
            drift = msgspec.structs.replace(learning.drift, solve_rate_start=start, solve_rate_end=end)
            runs.append((f"learning {start}->{end}", msgspec.structs.replace(learning, drift=drift)))
    rows: list[dict[str, Any]] = []
    for name, base in track(runs, description="simulating", console=console):
        rows += measure(name, args.seeds, args.max_staleness, base)
    table = Table(title=f"elastic (overlap) over each baseline, max_staleness {args.max_staleness}: "
                        f"mean (min-max) over {args.seeds} seeds")  # fmt: skip
    for column in HEADER:
        table.add_column(column, justify="right")
    lines = summary(rows)
    for line in lines:
        table.add_row(*line)
    console.print(table)
    header, stints = per_stint(rows)
    switching = Table(title="switches per training stint, every mode: the worst seed (target <= 2)")
    for column in header:
        switching.add_column(column, justify="right")
    for line in stints:
        switching.add_row(*line)
    console.print(switching)
    checks = verdicts(rows)
    for check in checks:
        console.print(check, highlight=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"max_staleness": args.max_staleness, "seeds": args.seeds, "rows": rows},
                                   indent=1, default=msgspec.to_builtins))  # fmt: skip
    markdown = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    markdown += ["| " + " | ".join(line) + " |" for line in lines]
    markdown += ["", "Switches per training stint (the worst seed):", "", "| " + " | ".join(header) + " |",
                 "|" + "---|" * len(header), *("| " + " | ".join(line) + " |" for line in stints)]  # fmt: skip
    args.out.with_suffix(".md").write_text("\n".join([*markdown, "", *checks, ""]))
    console.print(f"wrote {args.out} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()

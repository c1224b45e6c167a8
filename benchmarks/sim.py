"""The simulator's comparison of modes at equal cell budget (``gyre sim``), as a program with JSON output.

    python benchmarks/sim.py [--workload paper] [--max-staleness 1]

Prints elastic (single-step bursts and overlap), tuned async and colocate on the same executions of the workload,
the speed-ups of elastic with overlap over the two baselines against the issue's targets (>= 1.9x over async,
>= 2.0x over colocate, idle < 5%), and the sensitivity table; writes ``benchmarks/results/sim.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gyre.sim.report import compare, load_workload, sensitivity, speedups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--workload", default="paper", help="a workload TOML or a shipped name (paper, short)"
    )
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sim.json")
    args = parser.parse_args()
    console = Console()
    workload = load_workload(args.workload)
    results = compare(workload, args.max_staleness)
    table = Table(title=f"{args.workload}: {workload.tasks.steps} steps on {workload.cluster.cells} cells")
    for col in ("mode", "hours", "idle", "switches", "staleness mean/max"):
        table.add_column(col, justify="right")
    for name, r in results.items():
        table.add_row(name, f"{r.total_s / 3600:.1f}", f"{r.idle_fraction:.0%}", str(r.switches),
                      f"{r.staleness_mean:.2f} / {r.staleness_max}")  # fmt: skip
    console.print(table)
    over_async, over_colocate = speedups(results)
    idle = results["elastic (overlap)"].idle_fraction
    console.print(f"elastic (overlap): {over_async:.2f}x over tuned async (target >= 1.9x), "
                  f"{over_colocate:.2f}x over colocate (target >= 2.0x), idle {idle:.0%} (target < 5%)")  # fmt: skip
    rows = sensitivity(workload)
    sens = Table(title="Sensitivity: elastic (overlap) speed-up")
    for col in ("variation", "over async", "over colocate"):
        sens.add_column(col, justify="right")
    for name, a, c in rows:
        sens.add_row(name, f"{a:.2f}x", f"{c:.2f}x")
    console.print(sens)
    out = {
        "workload": args.workload,
        "max_staleness": args.max_staleness,
        "hours": {name: r.total_s / 3600 for name, r in results.items()},
        "idle": {name: r.idle_fraction for name, r in results.items()},
        "speedup_over_async": over_async,
        "speedup_over_colocate": over_colocate,
        "sensitivity": [{"variation": n, "over_async": a, "over_colocate": c} for n, a, c in rows],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

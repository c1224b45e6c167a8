"""`gyre sim`: a cluster and workload simulated in every mode, against the baselines and the bound."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gyre.sim.report import Speedups


def cmd_sim(args: argparse.Namespace) -> int:
    """Simulate a workload in every mode; print the comparison against the baselines and the bound (and the
    sensitivity table, the cell sweep, other seeds); plot the roles and the speed-up map."""
    from rich.console import Console
    from rich.table import Table

    from gyre.sim import report

    workload = report.load_workload(args.workload)
    # the tables are wide: a pipe's 80 columns would fold them
    console = Console(width=max(Console().width, 130))
    results = report.compare(workload, args.max_staleness)
    bound = report.lower_bound(workload, args.max_staleness)
    table = Table(title=f"gyre sim {args.workload}: {workload.tasks.steps} steps, {workload.cluster.cells} cells"
                        + ("" if workload.drift.stationary else ", moving"))  # fmt: skip
    for col in ("mode", "hours", "over elastic (overlap)", "idle", "switches", "per training stint",
                "staleness mean/max", "split"):  # fmt: skip
        table.add_column(col, justify="right")
    best = results[report.ELASTIC].total_s
    for name, r in results.items():
        table.add_row(name, f"{r.total_s / 3600:.2f}", f"{r.total_s / best:.2f}x", f"{r.idle_fraction:.0%}",
                      str(r.switches), f"{r.switches_per_stint:.2f}", f"{r.staleness_mean:.2f} / {r.staleness_max}",
                      str(r.async_train_cells or "-"))  # fmt: skip
    table.add_row("lower bound (any policy)", f"{bound.total_s / 3600:.2f}", f"{bound.total_s / best:.2f}x",
                  "", "", "", "", "", style="dim")  # fmt: skip
    console.print(table)
    console.print(_speedup_line(report.speedups(results, bound)))
    console.print(
        f"lower bound: work {bound.work_s / 3600:.1f} h, slowest executions' chain {bound.chain_s / 3600:.1f} h"
    )
    if args.seeds > 1:
        rows = [report.speedups(report.compare(w := report.with_seed(workload, workload.tasks.seed + k),
                                               args.max_staleness), report.lower_bound(w, args.max_staleness))
                for k in range(args.seeds)]  # fmt: skip
        seeds = Table(title=f"Elastic (overlap) over each baseline on {args.seeds} seeds: mean (min-max)")
        for col in ("user's async", "oracle async", "one-step", "colocate", "of the bound", "idle"):
            seeds.add_column(col, justify="right")
        fields = ("over_user_async", "over_oracle", "over_onestep", "over_colocate", "of_bound", "idle")
        cells = []
        for field in fields:
            values = [getattr(r, field) for r in rows]
            form = "{:.0%}" if field in ("of_bound", "idle") else "{:.2f}x"
            cells.append(
                f"{form.format(sum(values) / len(values))} ({form.format(min(values))}-{form.format(max(values))})"
            )
        seeds.add_row(*cells)
        console.print(seeds)
    if args.cells:
        sweep = Table(title="Cell count: hours per mode")
        shown = (report.ELASTIC, report.USER_ASYNC, report.ORACLE, report.COLOCATE)
        for col in ("cells", *shown, "best"):
            sweep.add_column(col, justify="right")
        counts = [int(c) for c in args.cells.split(",")]
        for count, by_mode in report.cell_sweep(workload, counts, args.max_staleness):
            hours = {m: by_mode[m].total_s / 3600 for m in shown}
            sweep.add_row(
                str(count), *(f"{h:.1f}" for h in hours.values()), min(hours, key=hours.__getitem__)
            )
        console.print(sweep)
    if args.sensitivity:
        sens = Table(title="Sensitivity: elastic (overlap) speed-up")
        for col in ("variation", "over user's async", "over oracle", "over colocate", "of the bound"):
            sens.add_column(col, justify="right")
        for name, sp in report.sensitivity(workload):
            sens.add_row(name, f"{sp.over_user_async:.2f}x", f"{sp.over_oracle:.2f}x", f"{sp.over_colocate:.2f}x",
                         f"{sp.of_bound:.0%}")  # fmt: skip
        console.print(sens)
    if args.plot:
        console.print(f"wrote {report.plot(results, Path(args.plot))}")
    if args.map:
        tails, shares = [2.0, 5.0, 10.0, 20.0, 40.0], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
        grid = report.speedup_map(workload, tails, shares, args.max_staleness, seeds=max(args.seeds, 1))
        title = (f"elastic over async with the user's split: {args.workload}, max_staleness {args.max_staleness}, "
                 f"{max(args.seeds, 1)} seed(s)")  # fmt: skip
        console.print(f"wrote {report.plot_map(grid, tails, shares, title, Path(args.map))}")
    return 0


def _speedup_line(sp: Speedups) -> str:
    return (f"elastic (overlap): {sp.over_user_async:.2f}x over async with the user's split, "
            f"{sp.over_oracle:.2f}x over the hindsight oracle, {sp.over_onestep:.2f}x over one-step off-policy, "
            f"{sp.over_colocate:.2f}x over colocate; {sp.of_bound:.0%} of the bound; idle {sp.idle:.0%}")  # fmt: skip


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The parsers of `gyre sim`."""
    s = sub.add_parser("sim", help="simulate a cluster and workload in every mode (elastic, async, colocate)")
    s.add_argument(
        "workload", help="workload TOML ([cluster], [tasks], [drift]) or a shipped one: paper, moving, ..."
    )
    s.add_argument("--max-staleness", type=int, default=1, help="versions between sampling and training")
    s.add_argument(
        "--sensitivity", action="store_true", help="also vary switch cost, tail heaviness, cell count"
    )
    s.add_argument("--plot", help="write the cells' roles over time to this PNG")
    s.add_argument("--cells", help="also compare the modes at these cell counts, e.g. 4,8,16")
    s.add_argument("--seeds", type=int, default=1, help="also summarise the speed-ups over this many seeds")
    s.add_argument(
        "--map", help="write elastic's speed-up over the user's async across tail x training share (PNG)"
    )
    s.set_defaults(fn=cmd_sim)

"""`gyre train` (and ``--resume``) and `gyre report`, its run directory's report.html."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gyre.cli.common import override
from gyre.errors import ConfigError


def cmd_train(args: argparse.Namespace) -> int:
    """Train online: the task suite's executions on the cells, elastic (or colocate/async) steps, the run directory."""
    from rich.console import Console

    from gyre.config import load_config
    from gyre.driver.training import resume_config, train

    if args.resume is not None and (args.config is not None or args.run_dir is not None):
        raise ConfigError(
            "gyre train --resume RUN_DIR reads RUN_DIR/config.toml: give no CONFIG or --run-dir"
        )
    overrides = list(args.set or [])
    for key, value in (("run.steps", args.steps), ("run.run_dir", args.run_dir), ("controller.mode", args.mode),
                       ("run.model_path", args.model)):  # fmt: skip
        if value is not None:
            overrides.append(override(key, value))
    cfg = (
        load_config(args.config, overrides) if args.resume is None else resume_config(args.resume, overrides)
    )
    from gyre.driver import eventloop

    if args.ray is not None:
        from gyre.control.placement import import_ray

        import_ray()  # without Ray: how to install it, before anything starts
    summary = eventloop.run(train(cfg, live=not args.no_live and sys.stdout.isatty(),
                                  resume=args.resume is not None, ray=args.ray))  # fmt: skip
    evals = (
        ""
        if summary.eval_first is None
        else f", held-out {summary.eval_first:.3f} -> {summary.eval_last:.3f}"
    )
    Console().print(
        f"gyre train: {summary.steps} steps ({summary.mode}) in {summary.total_s:.1f} s, "
        f"idle {summary.idle_fraction:.0%}, {summary.switches} switches, "
        f"reward {summary.reward_first:.3f} -> {summary.reward_last:.3f}{evals}; run directory {summary.run_dir}"
    )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """(Re)build a run directory's report.html from its journals."""
    from gyre.driver.runreport import write_report

    if not (args.run_dir / "metrics.jsonl").exists() and not (args.run_dir / "switches.jsonl").exists():
        raise ConfigError(
            f"{args.run_dir} is not a gyre train run directory (no metrics.jsonl or switches.jsonl)"
        )
    print(write_report(args.run_dir))
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The parsers of `gyre train`, `gyre report`."""
    s = sub.add_parser(
        "train", help="train a model online on a task suite (elastic cells; colocate or async)"
    )
    s.add_argument(
        "config", nargs="?", type=Path, help="the run's TOML ([run], [cells], [controller], [trainer])"
    )
    s.add_argument("--steps", type=int, help="optimizer steps (run.steps)")
    s.add_argument("--mode", choices=["elastic", "colocate", "async", "onestep"], help="controller.mode")
    s.add_argument("--model", help="model directory to train (run.model_path)")
    s.add_argument("--run-dir", help="run directory (run.run_dir)")
    s.add_argument(
        "--resume", type=Path, metavar="RUN_DIR",
        help="continue a killed run from its last checkpoint (finished executions are reused, not run again)",
    )  # fmt: skip
    s.add_argument(
        "--no-live", action="store_true", help="no live terminal view (it is off when not a terminal)"
    )
    s.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="dotted override, e.g. run.group_size=8"
    )
    s.add_argument(
        "--ray", nargs="?", const="auto", metavar="ADDRESS",
        help="place the cells and shards.count shards (at least 1) on a Ray cluster ([ray] resources); ADDRESS "
        "default: the cluster this machine belongs to (needs gyre[ray])",
    )  # fmt: skip
    s.set_defaults(fn=cmd_train)

    s = sub.add_parser("report", help="(re)build RUN_DIR/report.html from a gyre train run's journals")
    s.add_argument("run_dir", type=Path)
    s.set_defaults(fn=cmd_report)

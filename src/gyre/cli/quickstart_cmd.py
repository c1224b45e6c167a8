"""`gyre quickstart`: demonstrations -> SFT -> elastic RL on the pretrained tiny model, and its verdict."""

from __future__ import annotations

import argparse


def cmd_quickstart(args: argparse.Namespace) -> int:
    """Demonstrations -> SFT -> elastic RL on the pretrained tiny model, the held-out set before and after each; the
    verdict in words, exit status 1 when SFT did not beat the starting model or RL did not beat SFT."""
    from rich.console import Console
    from rich.table import Table

    from gyre.driver.quickstart import quickstart

    summary = quickstart(
        args.run_dir, args.model, short=args.short, progress=not args.no_progress, seed=args.seed
    )
    table = Table(title=f"gyre quickstart, seed {summary.seed}: held-out toy tasks, mean partial score; gain: "
                        "against the phase before, paired on the same executions")  # fmt: skip
    for column in ("after", "mean", "95%", "passed", "calls ok", "gain", "gain 95%"):
        table.add_column(column, justify="right", no_wrap=True)
    gains = {g.after: g for g in summary.gains}
    for p in summary.points:
        g = gains.get(p.phase)
        table.add_row(p.phase, f"{p.mean:.3f}", f"{p.ci_low:.2f}-{p.ci_high:.2f}", f"{p.pass_rate:.0%}",
                      f"{p.well_formed:.0%}", f"{g.mean:+.3f}" if g else "",
                      f"{g.ci_low:+.3f}..{g.ci_high:+.3f}" if g else "")  # fmt: skip
    console = Console(width=max(Console().width, 100))
    console.print(table)
    console.print(f"first-call-only floor {summary.floor:.3f}; RL training reward by step: "
                  + ", ".join(f"{r:.2f}" for r in summary.rl_rewards))  # fmt: skip
    console.print(", ".join(f"{k} {v:.0f} s" for k, v in summary.seconds.items())
                  + f"; total {summary.total_s / 60:.1f} min; {summary.run_dir} (train/report.html)")  # fmt: skip
    console.print(("[bold green]" if summary.learned else "[bold red]") + summary.verdict, highlight=False)
    return 0 if summary.learned else 1


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The parsers of `gyre quickstart`."""
    s = sub.add_parser(
        "quickstart",
        help="demonstrations -> SFT -> elastic RL on the pretrained tiny model, evaluated before and after each",
    )
    s.add_argument("--run-dir", help="default: runs/quickstart-toy-TIME")
    s.add_argument(
        "--model", help="the starting model (default: the shipped pretrained tiny model, models/tiny-shell)"
    )
    s.add_argument("--seed", type=int, default=0,
                   help="demonstrated tasks, SFT order, RL tasks and sampling, held-out sampling")  # fmt: skip
    s.add_argument("--short", action="store_true", help="a CI-sized version (fewer demonstrations and steps)")
    s.add_argument("--no-progress", action="store_true", help="no progress bars")
    s.set_defaults(fn=cmd_quickstart)

"""`gyre tasks`: prepare a suite's environments, import NL2RepoBench."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gyre.cli.common import run_loop
from gyre.errors import ConfigError, TaskError


def cmd_tasks_prepare(args: argparse.Namespace) -> int:
    """Build (or find) the environment of every task of a suite and check its grading can be faithful."""
    import time

    from rich.console import Console
    from rich.progress import Progress, TimeElapsedColumn
    from rich.table import Table

    from gyre.config import load_config
    from gyre.tasks import environments, resolve_suite
    from gyre.tasks.verify import Verifier

    cfg = load_config(args.config, list(args.set or [])).sandbox
    tasks = resolve_suite(args.suite)[: args.limit or None]
    verifier = Verifier(cfg)
    table = Table(title=f"gyre tasks prepare {args.suite}: environments in {environments.cache_root(cfg)}")
    for column in ("task", "environment", "prepared", "seconds", "packages", "left out", "grading"):
        table.add_column(column, overflow="fold")
    refused: dict[str, str] = {}

    async def run() -> None:
        columns = (*Progress.get_default_columns(), TimeElapsedColumn())
        with Progress(*columns, disable=args.no_progress, transient=True) as bar:
            job = bar.add_task("preparing", total=len(tasks))
            for task in tasks:
                bar.update(job, description=f"preparing {task.id}")
                row = [task.id, "-", "none declared", "", "", "", "ok"]
                start = time.monotonic()
                try:  # what can be refused without building anything is refused first (hidden tests missing)
                    verifier.check(task)
                except TaskError as exc:
                    refused[task.id] = str(exc)
                    row[2], row[6] = "not built", "[red]refused[/] (below)"
                    table.add_row(*row)
                    bar.advance(job)
                    continue
                if task.environment is not None:
                    was = environments.lookup(task.environment, cfg)
                    try:
                        done = await environments.ensure(task, cfg)
                        assert done is not None  # the task declares an environment
                        row[1:6] = [done.key[:12], "cached" if was else f"built ({done.installer})",
                                    f"{time.monotonic() - start:.1f}", str(len(done.installed)),
                                    "; ".join(done.skipped) or "-"]  # fmt: skip
                    except environments.EnvironmentFailed:
                        row[1:3] = [environments.environment_key(task.environment)[:12], "[red]failed[/]"]
                try:
                    await verifier.preflight(task)
                except TaskError as exc:
                    refused[task.id] = str(exc)
                    row[6] = "[red]refused[/] (below)"
                table.add_row(*row)
                bar.advance(job)

    run_loop(run())
    from gyre.driver.evaluation import PIPE_WIDTH

    (Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)).print(table)  # a pipe: never 80 columns
    for task_id, why in refused.items():
        print(f"refused {task_id}: {why}")
    if refused:
        print(
            f"{len(refused)} of {len(tasks)} task(s) refused: their grading could not be faithful",
            file=sys.stderr,
        )
    return 1 if refused else 0


def cmd_tasks_import_nl2repobench(args: argparse.Namespace) -> int:
    """Import NL2RepoBench tasks (`gyre.tasks.nl2repo_import`); a table of what was imported and why not."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from gyre.driver.evaluation import PIPE_WIDTH
    from gyre.tasks.nl2repo_import import find_tasks, import_benchmark, read_sources

    sources = read_sources(args.sources) if args.sources else {}
    base = args.sources.parent if args.sources else None
    for item in args.source:
        task, sep, spec = item.partition("=")
        if not sep or not task or not spec:
            raise ConfigError(f"--source {item!r}: expected TASK=SPEC")
        sources[task] = str(Path(spec).resolve()) if Path(spec).exists() else spec
    only = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    if only is None and not args.all:
        only = sorted(set(sources) & set(find_tasks(args.bench)))
        if not only:
            raise ConfigError(
                "no task has a source: give --source TASK=SPEC, --sources FILE, --tasks or --all"
            )
    results = import_benchmark(args.bench, args.out, sources, only, base)
    table = Table(title=f"gyre tasks import-nl2repobench {args.bench} -> {args.out}")
    for column in ("task", "result", "hidden tests", "grader", "solution", "source or reason"):
        table.add_column(column, overflow="fold")
    for r in results:
        if r.imported:
            table.add_row(
                r.task,
                "imported",
                str(len(r.tests)),
                str(len(r.grader)),
                str(len(r.solution)),
                escape(r.source),
            )
        else:  # a reason quotes command output: "[end of output]" is text, not markup
            table.add_row(r.task, f"[red]refused ({r.stage})[/]", "", "", "", escape(r.reason))
    (Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)).print(table)
    refused = [r for r in results if not r.imported]
    print(
        f"{len(results) - len(refused)} of {len(results)} task(s) imported into {args.out}", file=sys.stderr
    )
    return 1 if refused else 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The parsers of `gyre tasks`."""
    s = sub.add_parser("tasks", help="task suites: prepare their environments")
    tasks_sub = s.add_subparsers(dest="tasks_command", required=True)
    s = tasks_sub.add_parser(
        "prepare",
        help="build each task's Python environment (cached, shared) and check its grading can be faithful",
        epilog="exit status: 0 every task ready; 1 some task refused (the table says why); 2 a usage error",
    )
    s.add_argument(
        "suite", help="a built-in suite (toy, nl2repo-mini), a suite directory or one task directory"
    )
    s.add_argument("--limit", type=int, default=0, help="the first N tasks only")
    s.add_argument("--config", type=Path, help="TOML config file ([sandbox] section: env_cache_dir, ...)")
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help="dotted override")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.set_defaults(fn=cmd_tasks_prepare)
    s = tasks_sub.add_parser(
        "import-nl2repobench",
        help="build Gyre task folders from NL2RepoBench's public folders and each project's upstream source",
        epilog="exit status: 0 every task imported; 1 some task not (the table says why); 2 a usage error. "
        "Then `gyre tasks prepare OUT_DIR` builds the environments and checks each reference, and "
        "`gyre eval --suite OUT_DIR --agent oracle` grades them.",
    )
    s.add_argument("bench", type=Path, help="the NL2RepoBench repository (or its test_files folder)")
    s.add_argument("out", type=Path, help="where the task folders are written (one per task, replaced)")
    s.add_argument("--tasks", help="comma-separated task names (default: every task with a source)")
    s.add_argument("--source", action="append", default=[], metavar="TASK=SPEC",
                   help="a task's upstream source: a directory, an sdist, pypi:NAME==VERSION or git:URL@REV")  # fmt: skip
    s.add_argument("--sources", type=Path, help='a TOML file of task = "SPEC" lines (paths relative to it)')
    s.add_argument(
        "--all", action="store_true", help="every task of the benchmark, those without a source refused"
    )
    s.set_defaults(fn=cmd_tasks_import_nl2repobench)

"""The ``gyre`` command. Each subcommand lazy-imports what it needs, so ``gyre --help`` is instant."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from gyre.errors import ConfigError, GyreError, TaskError
from gyre.rundir import default_run_dir

if TYPE_CHECKING:
    from gyre.config import EngineConfig
    from gyre.sim.report import Speedups


def _engine_config(args: argparse.Namespace) -> EngineConfig:
    from gyre.config import load_config

    overrides = list(args.set or [])
    for key, value in (("model_path", args.model), ("port", getattr(args, "port", None)),
                       ("num_threads", getattr(args, "threads", None))):  # fmt: skip
        if value is not None and value != "":
            overrides.append(_override(f"engine.{key}", value))
    return load_config(args.config, overrides).engine


def _override(key: str, value: object) -> str:
    """A dotted override whose value is a TOML literal (strings quoted and escaped, so any path survives)."""
    if isinstance(value, Path):
        value = str(value)
    return f"{key}={json.dumps(value)}"


def cmd_init_model(args: argparse.Namespace) -> int:
    """Write a Hugging Face model directory from a preset."""
    from gyre.models import count_parameters, init_model

    path = init_model(args.dir, preset=args.preset, seed=args.seed, overwrite=args.overwrite)
    print(f"wrote {args.preset} model ({count_parameters(path):,} parameters) to {path}")
    return 0


def cmd_serve_engine(args: argparse.Namespace) -> int:
    """Serve the embedded engine over SGLang's HTTP API."""
    from gyre.engine.embedded.server import run_engine_server

    cfg = _engine_config(args)
    print(f"gyre engine: loading {cfg.model_path}; serving on http://{cfg.host}:{cfg.port}", file=sys.stderr)
    run_engine_server(cfg)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    """Send one chat generation to an engine (started here on --model when no --url is given)."""
    from gyre.engine.client import EngineClient
    from gyre.engine.launch import launch_embedded
    from gyre.models import load_tokenizer
    from gyre.protocol import SamplingParams

    tokenizer = load_tokenizer(args.model)
    messages = [{"role": "user", "content": args.prompt}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    input_ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p
    )

    async def run(url: str) -> None:
        async with EngineClient(url) as client:
            start = time.perf_counter()
            out = await client.generate(input_ids, params, return_logprob=True)
            elapsed = time.perf_counter() - start
        lps = out.output_logprobs
        print(
            f"prompt: {len(input_ids)} tokens; output: {len(out.output_ids)} tokens in {elapsed:.2f} s "
            f"({len(out.output_ids) / elapsed:.0f} tokens/s), finish {out.meta_info.finish_reason}, "
            f"weight version {out.meta_info.weight_version}"
        )
        print(f"mean logprob {sum(lps) / max(len(lps), 1):.3f}")
        print("text:", repr(out.text))

    if args.url:
        asyncio.run(run(args.url))
        return 0
    overrides = [f"engine.num_threads={args.threads}"] if args.threads else []
    with launch_embedded(args.model, overrides=overrides) as server:
        print(f"started the embedded engine at {server.url}")
        asyncio.run(run(server.url))
    return 0


def cmd_router(args: argparse.Namespace) -> int:
    """Serve the OpenAI-compatible router in front of running engines."""
    from gyre.config import load_config
    from gyre.router.core import Router
    from gyre.router.server import serve_router

    overrides = list(args.set or [])
    if args.engines:
        overrides.append(
            _override("router.engines", [u.strip() for u in args.engines.split(",") if u.strip()])
        )
    for key, value in (("model_path", args.model), ("port", args.port), ("admin_port", args.admin_port),
                       ("journal_dir", args.journal)):  # fmt: skip
        if value is not None:
            overrides.append(_override(f"router.{key}", value))
    cfg = load_config(args.config, overrides).router

    async def run() -> None:
        router = Router(cfg)
        from gyre.loop import freeze_heap

        freeze_heap()  # the model's tokenizer and templates are permanent: keep them out of every collection
        print(
            f"gyre router: http://{cfg.host}:{cfg.port}/s/{{session}}/v1 for agents, "
            f"http://127.0.0.1:{cfg.admin_port}/admin for sessions and engines; "
            f"engines: {', '.join(cfg.engines) or 'none yet'}",
            file=sys.stderr,
        )
        await serve_router(router)

    _run_loop(run())
    return 0


def cmd_session(args: argparse.Namespace) -> int:
    """Open a router session and print its OpenAI base URL (for an external scaffold)."""
    import httpx

    resp = httpx.post(args.admin.rstrip("/") + "/admin/sessions", json={"execution_id": args.execution_id})
    if resp.status_code != 200:
        print(f"gyre session: error: {resp.text}", file=sys.stderr)
        return 2
    data = resp.json()
    print(f"OPENAI_BASE_URL={data['base_url']}\nOPENAI_API_KEY={data['token']}")
    return 0


def _run_loop(coro: Coroutine[Any, Any, object]) -> None:
    """Run a driver's coroutine (`gyre.loop`: uvloop where installed, the start-up heap frozen)."""
    from gyre import loop

    loop.run(coro)


EXIT_NOT_CLEAN = 3  # `gyre eval` finished, but dropped executions or (oracle) a reference scoring below 1


def cmd_eval(args: argparse.Namespace) -> int:
    """Run an evaluation and print its summary; `EXIT_NOT_CLEAN` when the summary lists problems."""
    from gyre.config import load_config
    from gyre.evaluation import EvalOptions, print_summary, run_eval

    loaded = load_config(args.config, list(args.set or []))
    sandbox = loaded.sandbox
    if args.ray is not None:
        from gyre.control.placement import import_ray

        import_ray()  # without Ray: how to install it, before anything starts
    name = args.suite.rstrip("/").rsplit("/", 1)[-1].replace(":", "-")
    run_dir = args.run_dir or str(default_run_dir("eval", name))
    try:
        options = EvalOptions(
            suite=args.suite, run_dir=run_dir, agent=args.agent, expert=args.expert, model_path=args.model_path,
            model_name=args.model, engine_url=args.engine_url, base_url=args.base_url, api_key_env=args.api_key_env,
            concurrency=args.concurrency,
            group_size=args.group_size, limit=args.limit, max_steps=args.max_steps, temperature=args.temperature,
            seed=args.seed, sandbox=sandbox, progress=not args.no_progress, agent_profile=args.agent_profile,
            max_tokens_per_call=args.max_tokens_per_call, verifier_retries=args.verifier_retries,
            shards=loaded.shards.count if args.shards is None else args.shards, ray=args.ray, placement=loaded.ray,
            shard_settings=loaded.shards,
        )  # fmt: skip
        options = msgspec.convert(msgspec.to_builtins(options), EvalOptions)  # checks the bounds
    except msgspec.ValidationError as exc:
        raise ConfigError(f"bad option: {exc}") from None
    summary = run_eval(options)
    print_summary(summary, run_dir)
    return 0 if summary.ok else EXIT_NOT_CLEAN


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

    _run_loop(run())
    from gyre.evaluation import PIPE_WIDTH

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

    from gyre.evaluation import PIPE_WIDTH
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


def cmd_sandbox_run(args: argparse.Namespace) -> int:
    """Run one command in the sandbox an agent would get and print what happened (to check a set-up)."""
    from gyre.config import load_config
    from gyre.sandbox import ExecResult, check_backend, make_sandbox

    overrides = list(args.set or [])
    if args.backend:
        overrides.append(f'sandbox.backend="{args.backend}"')
    cfg = load_config(args.config, overrides).sandbox
    argv = args.cmd[1:] if args.cmd[:1] == ["--"] else list(args.cmd)
    if not argv:
        print("gyre sandbox run: give the command after --, e.g. gyre sandbox run -- ls /", file=sys.stderr)
        return 2
    command: str | list[str] = argv[0] if len(argv) == 1 else argv  # one word or a quoted line: bash -c
    print(f"sandbox: {check_backend(cfg)}", file=sys.stderr)
    results: list[ExecResult] = []

    async def run() -> None:
        async with make_sandbox(cfg, workspace=args.workspace) as sb:
            results.append(await sb.exec(command, timeout_s=args.timeout))

    _run_loop(run())
    r = results[0]
    flags = [
        *(["timed out"] if r.timed_out else []),
        *(["output truncated"] if r.truncated else []),
        *([f"killed by {r.killed_by}"] if r.killed_by else []),
        *([f"resource exceeded: {r.resource_exceeded}"] if r.resource_exceeded else []),
    ]
    print(f"exit code: {r.exit_code} ({r.duration_s:.3f} s)")
    print(f"flags: {', '.join(flags) or 'none'}")
    print("--- stdout ---")
    print(r.stdout, end="" if r.stdout.endswith("\n") or not r.stdout else "\n")
    print("--- stderr ---")
    print(r.stderr, end="" if r.stderr.endswith("\n") or not r.stderr else "\n")
    return 124 if r.timed_out else r.exit_code


def cmd_trainer_core(args: argparse.Namespace) -> int:
    """Run the core trainer process (authoritative weights, optimizer, micro-step queue)."""
    from gyre.config import load_config
    from gyre.train.core import run_core
    from gyre.train.layout import check_run_layout

    overrides = list(args.set or [])
    for key, value in (("model_path", args.model), ("bind", args.bind), ("resume_from", args.resume),
                       ("num_threads", args.threads)):  # fmt: skip
        if value is not None and value != "":
            overrides.append(_override(f"trainer.{key}", value))
    cfg = load_config(args.config, overrides).trainer
    layout = check_run_layout(cfg, cfg.resume_from or cfg.model_path)  # a refusal starts nothing
    print(layout, file=sys.stderr)
    run_core(cfg, ready=lambda address: print(f"gyre trainer core: listening at {address}", file=sys.stderr))
    # The core has closed its sockets and groups; gloo's pair objects still connected to live members abort the
    # interpreter's teardown (std::terminate), so a finished core leaves without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def cmd_trainer_satellite(args: argparse.Namespace) -> int:
    """Run a satellite trainer that joins the core's steps until told to leave (SIGTERM: after its micro-step)."""
    import signal

    from gyre.train.satellite import Satellite

    satellite = Satellite(args.core, args.name, args.threads or 0, args.backend, args.tensor_parallel,
                          args.pipeline_parallel)  # fmt: skip
    signal.signal(signal.SIGTERM, lambda *_: satellite.request_leave())
    try:
        while True:
            summary = satellite.run()
            print(f"gyre trainer satellite {summary.member}: {summary.micro_steps} micro-steps, "
                  f"{summary.tokens} tokens, joined in {summary.join_s:.3f} s", file=sys.stderr)  # fmt: skip
            if not args.stay:
                return 0
    finally:
        satellite.close()


def cmd_train(args: argparse.Namespace) -> int:
    """Train online: the task suite's executions on the cells, elastic (or colocate/async) steps, the run directory."""
    from rich.console import Console

    from gyre.config import load_config
    from gyre.training import resume_config, train

    if args.resume is not None and (args.config is not None or args.run_dir is not None):
        raise ConfigError(
            "gyre train --resume RUN_DIR reads RUN_DIR/config.toml: give no CONFIG or --run-dir"
        )
    overrides = list(args.set or [])
    for key, value in (("run.steps", args.steps), ("run.run_dir", args.run_dir), ("controller.mode", args.mode),
                       ("run.model_path", args.model)):  # fmt: skip
        if value is not None:
            overrides.append(_override(key, value))
    cfg = (
        load_config(args.config, overrides) if args.resume is None else resume_config(args.resume, overrides)
    )
    from gyre import loop

    if args.ray is not None:
        from gyre.control.placement import import_ray

        import_ray()  # without Ray: how to install it, before anything starts
    summary = loop.run(train(cfg, live=not args.no_live and sys.stdout.isatty(), resume=args.resume is not None,
                             ray=args.ray))  # fmt: skip
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


def cmd_quickstart(args: argparse.Namespace) -> int:
    """Demonstrations -> SFT -> elastic RL on the pretrained tiny model, the held-out set before and after each; the
    verdict in words, exit status 1 when SFT did not beat the starting model or RL did not beat SFT."""
    from rich.console import Console
    from rich.table import Table

    from gyre.quickstart import quickstart

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


def cmd_pretrain(args: argparse.Namespace) -> int:
    """Pretrain the tiny model on shell sessions (the quickstart's starting model); ``--export``: ship it."""
    from gyre.pretrain import ASSET, export, pretrain

    result = pretrain(args.out, seed=args.seed, steps=args.steps, threads=args.threads,
                      progress=not args.no_progress)  # fmt: skip
    print(f"{args.out}: held-out copied names, first digit {result['first_digit']:.3f}, every digit "
          f"{result['every_digit']:.3f}; {result['seconds']:.0f} s")  # fmt: skip
    if args.export:
        print(
            f"shipped as {export(args.out)} (what the quickstart starts from; {ASSET.stat().st_size:,} bytes)"
        )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """(Re)build a run directory's report.html from its journals."""
    from gyre.report import write_report

    if not (args.run_dir / "metrics.jsonl").exists() and not (args.run_dir / "switches.jsonl").exists():
        raise ConfigError(
            f"{args.run_dir} is not a gyre train run directory (no metrics.jsonl or switches.jsonl)"
        )
    print(write_report(args.run_dir))
    return 0


def cmd_cell(args: argparse.Namespace) -> int:
    """Run one cell: its engine (and on the core cell the core trainer), switching roles on the controller's word."""
    from gyre.config import load_config
    from gyre.control.cell import CellSpec, run_cell

    overrides = list(args.set or [])
    if args.host:
        overrides.append(_override("cells.host", args.host))
    cfg = load_config(args.config, overrides)
    spec = CellSpec(name=args.name, kind=args.kind, order=args.order, controller=args.controller,
                    model_path=args.model or cfg.engine.model_path, log_dir=args.log_dir or "")  # fmt: skip
    if not spec.model_path:
        raise ConfigError("gyre cell needs a model: --model DIR or engine.model_path")
    run_cell(cfg, spec)
    # as the core trainer: gloo's pair objects abort the interpreter's teardown, so a finished cell leaves without it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def cmd_shard(args: argparse.Namespace) -> int:
    """Run one runtime shard: executions and a router for their sessions, on the driver's shard hub's word."""
    from gyre.config import load_config
    from gyre.runtime.shard import run_shard

    cfg = load_config(args.config, list(args.set or []))
    run_shard(cfg, args.name, args.hub, os.environ.get("GYRE_RAY_NODE", ""))
    return 0


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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    p = argparse.ArgumentParser(prog="gyre", description="Elastic online RL for long-horizon LLM agents.")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("init-model", help="write a Hugging Face model directory from a preset")
    s.add_argument("dir", type=Path)
    s.add_argument("--preset", default="tiny")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--overwrite", action="store_true")
    s.set_defaults(fn=cmd_init_model)

    s = sub.add_parser("serve-engine", help="serve the embedded engine (SGLang's HTTP API)")
    s.add_argument("--model", help="Hugging Face model directory")
    s.add_argument("--port", type=int)
    s.add_argument("--threads", type=int, help="torch CPU threads")
    s.add_argument("--config", type=Path, help="TOML config file ([engine] section)")
    s.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="dotted override, e.g. engine.kv_cache_mem_gib=2"
    )
    s.set_defaults(fn=cmd_serve_engine)

    s = sub.add_parser("generate", help="send one chat generation to an engine")
    s.add_argument(
        "--model", required=True, help="model directory (for the tokenizer, and to serve without --url)"
    )
    s.add_argument("--url", help="engine base URL; without it an embedded engine is started")
    s.add_argument("--prompt", default="Hello! Which tools do you have?")
    s.add_argument("--max-new-tokens", type=int, default=64)
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--threads", type=int, default=0)
    s.set_defaults(fn=cmd_generate)

    s = sub.add_parser("router", help="serve the OpenAI-compatible router in front of engines")
    s.add_argument("--engines", help="comma-separated engine base URLs")
    s.add_argument("--model", help="the served model's directory (chat template, tokenizer)")
    s.add_argument("--port", type=int, help="agent-facing port (default 8000)")
    s.add_argument("--admin-port", type=int, help="admin port on 127.0.0.1 (default 8001)")
    s.add_argument("--journal", help="directory for calls.jsonl")
    s.add_argument("--config", type=Path, help="TOML config file ([router] section)")
    s.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="dotted override, e.g. router.retry_budget=3"
    )
    s.set_defaults(fn=cmd_router)

    s = sub.add_parser("session", help="open a router session; prints OPENAI_BASE_URL and OPENAI_API_KEY")
    s.add_argument("--admin", default="http://127.0.0.1:8001", help="the router's admin URL")
    s.add_argument("--execution-id", help="name the session's records carry")
    s.set_defaults(fn=cmd_session)

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

    s = sub.add_parser("sandbox", help="sandboxes agents run commands in")
    sandbox_sub = s.add_subparsers(dest="sandbox_command", required=True)
    s = sandbox_sub.add_parser(
        "run",
        help="run one command in the sandbox an agent would get; prints its result and what was blocked",
    )
    s.add_argument(
        "--workspace", type=Path, help="bind this directory as the workspace (default: a new empty one)"
    )
    s.add_argument(
        "--backend", choices=["bubblewrap", "local"], help="default: sandbox.backend of the config"
    )
    s.add_argument("--timeout", type=float, help="wall-clock seconds (default: sandbox.default_timeout_s)")
    s.add_argument("--config", type=Path, help="TOML config file ([sandbox] section)")
    s.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="dotted override, e.g. sandbox.memory_mib=512"
    )
    s.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command (one argument: a bash line)")
    s.set_defaults(fn=cmd_sandbox_run)

    s = sub.add_parser(
        "eval",
        help="run a model (or a suite's oracle) over a task suite and score it",
        epilog=f"exit status: 0 a clean run; 2 a usage or configuration error; {EXIT_NOT_CLEAN} finished but not "
        "clean (an execution was dropped, or with --agent oracle a reference solution scored below 1)",
    )
    s.add_argument(
        "--suite", required=True, help="toy, toy:N[:SEED], nl2repo-mini, or a suite/task directory"
    )
    s.add_argument(
        "--agent",
        default="builtin",
        help="builtin | oracle (reference solutions / scripted expert) | command:ARGV | python:MODULE:ATTR "
        "(or python:FILE.py:ATTR; e.g. python:gyre.agents.frameworks:langgraph)",
    )
    s.add_argument("--expert", default="", help="the scripted expert --agent oracle plays (default: the suite's; "
                   "toy-chain-impatient gives up partway)")  # fmt: skip
    s.add_argument(
        "--model-path", default="models/tiny", help="model directory (tokenizer; weights to serve)"
    )
    s.add_argument("--model", default="", help="the model name agents send (default: the directory's name)")
    s.add_argument(
        "--engine-url", default="", help="an engine speaking SGLang's API; default: start the embedded one"
    )
    s.add_argument(
        "--base-url",
        default="",
        help="an outside OpenAI-compatible model (e.g. https://host/v1); evaluation only",
    )
    s.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable with its API key")
    s.add_argument("--concurrency", type=int, default=8, help="executions at once")
    s.add_argument("--group-size", type=int, default=1, help="executions per task")
    s.add_argument("--limit", type=int, default=0, help="the first N tasks only")
    s.add_argument(
        "--max-steps", type=int, default=50, help="most agent steps per execution (a task may allow fewer)"
    )
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--seed", type=int, default=None,
                   help="seed the built-in agent's sampling: two evaluations with one seed compare pairwise")  # fmt: skip
    s.add_argument(
        "--max-tokens-per-call", type=int, default=1024, help="the built-in agent's limit per call"
    )
    s.add_argument(
        "--verifier-retries", type=int, default=2, help="verifier attempts after the first before dropping"
    )
    s.add_argument(
        "--agent-profile", choices=["default", "lean"], default="default",
        help="the built-in agent's prompt (and the oracle's): lean = bash and submit, a one-line system prompt",
    )  # fmt: skip
    s.add_argument("--run-dir", help="default: runs/eval-SUITE-TIME")
    s.add_argument("--config", type=Path, help="TOML config file ([sandbox], [shards]; with --ray, [ray])")
    s.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="dotted override, e.g. sandbox.memory_mib=512"
    )
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.add_argument("--shards", type=int, default=None,
                   help="runtime shards (processes) running the executions; 0: this process; default: the config's "
                        "shards.count")  # fmt: skip
    s.add_argument(
        "--ray", nargs="?", const="auto", metavar="ADDRESS",
        help="place the shards (at least 1) on a Ray cluster; ADDRESS default: the cluster this machine belongs to",
    )  # fmt: skip
    s.set_defaults(fn=cmd_eval)

    s = sub.add_parser("trainer", help="trainer processes: the core, and satellites that join its steps")
    trainer_sub = s.add_subparsers(dest="trainer_command", required=True)
    s = trainer_sub.add_parser(
        "core", help="the core trainer: weights, optimizer, the step's micro-step queue"
    )
    s.add_argument("--model", help="Hugging Face model directory to train (trainer.model_path)")
    s.add_argument("--bind", help="ZeroMQ address to listen at (default tcp://127.0.0.1:5570)")
    s.add_argument("--resume", help="checkpoint directory to continue from (trainer.resume_from)")
    s.add_argument("--threads", type=int, help="torch CPU threads")
    s.add_argument("--config", type=Path, help="TOML config file ([trainer] section)")
    s.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="dotted override, e.g. trainer.learning_rate=1e-4"
    )
    s.set_defaults(fn=cmd_trainer_core)
    s = trainer_sub.add_parser("satellite", help="a satellite trainer joining the core's steps")
    s.add_argument("--core", required=True, help="the core's address, tcp://HOST:PORT")
    s.add_argument("--name", help="member name (default: host, pid and a random suffix)")
    s.add_argument("--threads", type=int, help="torch CPU threads")
    s.add_argument("--stay", action="store_true", help="rejoin after being told to leave (until killed)")
    s.add_argument(
        "--backend", choices=["torch", "megatron"], default="torch", help="what computes its gradients"
    )
    s.add_argument(
        "--tensor-parallel", type=int, default=1, help="a Megatron satellite's tensor-parallel ranks"
    )
    s.add_argument("--pipeline-parallel", type=int, default=1, help="a Megatron satellite's pipeline stages")
    s.set_defaults(fn=cmd_trainer_satellite)

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

    s = sub.add_parser(
        "pretrain", help="pretrain the tiny model on shell sessions: the quickstart's starting model"
    )
    s.add_argument("--out", default="models/tiny-shell-new", help="the model directory to write")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--steps", type=int, default=1500)
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--export", action="store_true", help="also write it as the checkpoint Gyre ships")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.set_defaults(fn=cmd_pretrain)

    s = sub.add_parser("report", help="(re)build RUN_DIR/report.html from a gyre train run's journals")
    s.add_argument("run_dir", type=Path)
    s.set_defaults(fn=cmd_report)

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

    s = sub.add_parser(
        "shard", help="one runtime shard: executions and their router, for a driver's shard hub"
    )
    s.add_argument("--hub", required=True, help="the driver's shard hub, tcp://HOST:PORT")
    s.add_argument("--name", required=True, help="the shard's name (shard-0 ...)")
    s.add_argument("--config", type=Path, help="the run's TOML config ([router], [sandbox], [shards])")
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help="dotted override")
    s.set_defaults(fn=cmd_shard)

    s = sub.add_parser(
        "cell", help="one cell: an engine and a trainer that serve or train on the controller's word"
    )
    s.add_argument("--controller", required=True, help="the controller's address, tcp://HOST:PORT")
    s.add_argument("--name", required=True, help="the cell's name (cell-0 ...)")
    s.add_argument("--kind", choices=["core", "satellite", "standalone"], default="satellite")
    s.add_argument("--order", type=int, default=1, help="place in the training order (0: the core)")
    s.add_argument("--model", help="Hugging Face model directory (engine.model_path)")
    s.add_argument("--log-dir", help="where the cell's engine writes its log")
    s.add_argument(
        "--host", help="this machine's address as the others reach it (cells.host; default 127.0.0.1)"
    )
    s.add_argument(
        "--config", type=Path, help="the run's TOML config ([cells], [controller], [trainer], [engine])"
    )
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help="dotted override")
    s.set_defaults(fn=cmd_cell)

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

    s = sub.add_parser("sft", help="supervised warm start on demonstrations (a scripted expert's calls)")
    s.add_argument("config", nargs="?", type=Path, help="the run's TOML ([sft], and [trainer] for AdamW)")
    s.add_argument(
        "--journal",
        action="append",
        help="calls.jsonl, journal or run directory of demonstrations (sft.journals; repeatable)",
    )
    s.add_argument("--model", help="model directory to start from (sft.model_path)")
    s.add_argument("--output-dir", help="where metrics, sft.json and checkpoints go (sft.output_dir)")
    s.add_argument("--epochs", type=int, help="passes over the demonstrations (sft.epochs)")
    s.add_argument(
        "--all-sources",
        action="store_true",
        help="train on every call record (policy, upstream too), not only the scripted expert's",
    )
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="dotted override, e.g. sft.learning_rate=3e-3"
    )
    s.set_defaults(fn=cmd_sft)
    return p


def cmd_sft(args: argparse.Namespace) -> int:
    """Supervised warm start on demonstration call records; the output directory holds a Gyre checkpoint."""
    from rich.console import Console

    from gyre.config import load_config
    from gyre.sft import run_sft

    overrides = list(args.set or [])
    for key, value in (("sft.journals", args.journal), ("sft.model_path", args.model),
                       ("sft.output_dir", args.output_dir), ("sft.epochs", args.epochs)):  # fmt: skip
        if value is not None:
            overrides.append(_override(key, value))
    if args.all_sources:
        overrides.append(_override("sft.sources", ["policy", "scripted", "upstream"]))
    s = run_sft(load_config(args.config, overrides), progress=not args.no_progress)
    left_out = f", {sum(s.skipped.values())} calls left out" if s.skipped else ""
    Console().print(
        f"gyre sft: {s.sessions} demonstration sessions ({s.calls} calls{left_out}), {s.steps} steps over "
        f"{s.epochs} epochs, {s.tokens:,} tokens trained ({s.computed_tokens:,} computed, "
        f"{s.tokens_per_s:,.0f}/s), loss {s.loss_first:.3f} -> {s.loss_last:.3f} in {s.total_s:.1f} s; "
        f"checkpoint {s.checkpoint}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the ``gyre`` command; a GyreError prints one clear line and exits 2."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.fn(args))
    except GyreError as exc:
        print(f"gyre {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130

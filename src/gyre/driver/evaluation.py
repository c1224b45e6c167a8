"""`gyre eval`: run a model (or a suite's oracle) over a task suite, score every execution, report.

One entry, `run_eval(options)`: it resolves the suite, starts what serves the model (the embedded engine on a local
model directory, an SGLang-API engine at ``engine_url``, or the suite's scripted expert for ``--agent oracle``),
puts the router and the runtime in front, runs ``group_size`` executions per task with at most ``concurrency`` at
once, and writes into the run directory: ``journal/`` (every call token-exact, every execution result with its
verdict), ``results.json``, ``results.md`` and ``scores.png``.

Every headline says what its mean and pass rate are over ("over 1 scored of 2 executions, 1 dropped"): dropped
executions are left out of both, so a run that dropped half its tasks must not read as a clean 1.000. What makes a
run's figures untrustworthy as they stand is listed in ``EvalSummary.problems`` (empty: ``summary.ok``): any task
that did not run, any dropped execution and, with ``--agent oracle`` (which validates a suite), any reference
solution scoring below 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec

from gyre.agents.toolagent import BuiltinAgentConfig
from gyre.config import RayConfig, RouterConfig, SandboxConfig, ShardsConfig
from gyre.driver.rundir import RunDir
from gyre.errors import ConfigError, TaskError
from gyre.router.routing import Router
from gyre.runtime import (
    AgentSpec,
    BuiltinAgentSpec,
    CommandAgentSpec,
    ExecutionResult,
    ExecutionSpec,
    OracleAgentSpec,
    PythonAgentSpec,
    Runtime,
)
from gyre.tasks import Task, Verifier, resolve_suite
from gyre.tasks.verify import TRAINABLE_OUTCOMES

if TYPE_CHECKING:
    from gyre.runtime.shards import ShardedRuntime

SCORE_BINS = (0.0, 0.25, 0.5, 0.75, 1.0)
BIN_LABELS = (
    "0",
    "(0, 0.25]",
    "(0.25, 0.5]",
    "(0.5, 0.75]",
    "(0.75, 1)",
    "1",
)  # the score distribution's bins


class EvalOptions(msgspec.Struct, kw_only=True):
    """What `gyre eval` runs."""

    suite: str  # a built-in suite name (toy, toy:N[:SEED], nl2repo-mini) or a suite/task directory
    run_dir: str  # where the journal and the results go
    agent: str = "builtin"  # builtin | oracle | command:ARGV (a process) | python:MODULE:ATTR (a callable)
    expert: str = (
        ""  # the scripted expert the oracle plays (a name in gyre.tasks.catalog.EXPERTS); empty: the suite's
    )
    model_path: str = "models/tiny"  # tokenizer and chat template (and the weights, for the embedded engine)
    model_name: str = ""  # what agents pass as `model`; empty: the model directory's name
    engine_url: str = ""  # an engine speaking SGLang's API (e.g. SGLang); empty: start the embedded one
    base_url: str = ""  # an outside OpenAI-compatible model instead (no token-exact records: evaluation only)
    api_key_env: str = "OPENAI_API_KEY"  # the environment variable holding its API key
    concurrency: Annotated[int, msgspec.Meta(ge=1)] = 8  # executions at once
    engine_threads: Annotated[int, msgspec.Meta(ge=0)] = (
        0  # the embedded engine's torch threads; 0: its default
    )
    group_size: Annotated[int, msgspec.Meta(ge=1)] = 1  # executions per task
    limit: Annotated[int, msgspec.Meta(ge=0)] = 0  # the first N tasks only; 0: all
    max_steps: Annotated[int, msgspec.Meta(ge=1)] = (
        50  # the built-in agent's main-context calls, unless a task says
    )
    temperature: float = 1.0
    seed: int | None = None  # the built-in agent's sampling seed (evaluations with one seed compare pairwise)
    agent_profile: Literal["default", "lean"] = "default"  # the built-in agent's (and the oracle's) prompt
    max_tokens_per_call: Annotated[int, msgspec.Meta(ge=1)] = 1024
    max_idle_calls: Annotated[int, msgspec.Meta(ge=0)] = (
        0  # the built-in agent gives up after N tool-less calls
    )
    verifier_retries: Annotated[int, msgspec.Meta(ge=0)] = 2
    sandbox: SandboxConfig = msgspec.field(default_factory=SandboxConfig)
    progress: bool = True  # a rich progress bar on the terminal
    shards: Annotated[int, msgspec.Meta(ge=0)] = 0  # runtime shards running the executions; 0: this process
    ray: str | None = (
        None  # a Ray cluster's address (auto: this machine's) to place the shards on; None: here
    )
    placement: RayConfig = msgspec.field(default_factory=RayConfig)  # --config's [ray]: what each shard needs
    shard_settings: ShardsConfig = msgspec.field(default_factory=ShardsConfig)  # --config's [shards]


class ExecutionRow(msgspec.Struct, frozen=True, kw_only=True):
    """One execution in the results."""

    task_id: str
    group_index: int
    status: str  # done, budget_exceeded, resource_exceeded, crashed, cancelled
    outcome: str  # scored, placeholder, tampered, dropped, unscored
    score: float
    passed: int | None
    declared: int | None
    calls: int
    prompt_tokens: int
    completion_tokens: int
    wall_s: float
    error: str | None
    detail: str = ""  # the verdict's detail (its last 1000 characters): why it was dropped, tampered or < 1


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """A task preflight refused (`Verifier.preflight`): never run, and why."""

    reason: str  # the refusal's first line (what is wrong), whitespace collapsed and cut short
    log: str  # the refusal whole, the tools' own output included: a file, relative to the run directory


class EvalSummary(msgspec.Struct, frozen=True, kw_only=True):
    """The whole evaluation."""

    suite: str
    agent: str
    model: str
    tasks: int
    executions: int
    mean_score: float  # over the `counted` executions (dropped and unscored ones are left out)
    mean_ci: tuple[float, float] = (0.0, 0.0)  # its 95% bootstrap interval (executions resampled)
    pass_rate: float  # share of the `counted` executions with score 1
    score_distribution: dict[str, int]  # bin label -> executions
    outcomes: dict[str, int]
    statuses: dict[str, int]
    mean_calls: float
    mean_tokens: float  # prompt (new input) + completion tokens per execution
    wall_s: float
    unsupported: dict[str, str]  # task id -> why this host cannot run or score it (never run)
    rows: list[ExecutionRow]
    tampered: int = 0  # executions the verifier caught tampering with the grader (scored 0; also in outcomes)
    counted: int = 0  # executions the mean and pass rate are over (scored, placeholder, tampered)
    dropped: int = 0  # executions left out of them: the verifier failed, or the host failed them
    problems: list[str] = msgspec.field(default_factory=list)  # why the figures are not clean; one line each
    refused: dict[str, Refusal] = msgspec.field(default_factory=dict)  # task id -> why preflight refused it

    @property
    def ok(self) -> bool:
        """A clean run: every task ran, nothing was dropped and, for the oracle, every reference solution scored 1."""
        return not self.problems


def run_eval(options: EvalOptions) -> EvalSummary:
    """Run the evaluation (blocking: owns its event loop) and write the results; see the module."""
    from gyre.driver import eventloop

    return eventloop.run(evaluate(options))


async def evaluate(options: EvalOptions) -> EvalSummary:
    """Run the evaluation in the current event loop and write the results."""
    if (options.shards or options.ray is not None) and options.base_url:
        raise ConfigError("--base-url (an outside model, no token-exact records) runs in this process: it cannot "
                          "run on shards; give --shards/--ray an engine (--engine-url, or the embedded one)")  # fmt: skip
    tasks = resolve_suite(options.suite)
    if options.limit:
        tasks = tasks[: options.limit]
    unsupported = {t.id: _why_not(t, options) for t in tasks}
    unsupported = {k: v for k, v in unsupported.items() if v}  # never run, reported
    runnable = [t for t in tasks if t.id not in unsupported]
    agent = agent_spec(options.agent, runnable)
    rd = RunDir(options.run_dir)  # the layout gyre train uses too
    run_dir, journal = rd.root, rd.journal
    journal.mkdir(parents=True, exist_ok=True)
    (run_dir / "options.json").write_bytes(msgspec.json.format(msgspec.json.encode(options)))
    start = time.monotonic()
    results: list[ExecutionResult] = []
    verifier = Verifier(options.sandbox, retries=options.verifier_retries)
    refused = await _preflight(verifier, runnable, options.progress)  # environments, faithful grading
    refusals = _log_refusals(rd, refused)
    runnable = [t for t in runnable if t.id not in refused]
    specs = [
        ExecutionSpec(task=t, group_index=g, agent=_for_task(agent, t, options))
        for t in runnable
        for g in range(options.group_size)
    ]
    async with _serving(options, runnable) as engine_url:
        if options.shards or options.ray is not None:
            results = await _run_sharded(options, engine_url, specs)
            model_name = options.model_name or Path(options.model_path).name or "gyre"
        else:
            router = _router(options, engine_url, journal)
            model_name = router.model_name
            runtime = Runtime(
                router, options.sandbox, str(journal), max_concurrency=options.concurrency, verifier=verifier
            )
            try:
                results = await _run_with_progress(runtime, specs, options.progress)
            finally:
                await runtime.aclose()
                await router.aclose()
    summary = summarize(options, tasks, results, unsupported, time.monotonic() - start, model_name, refusals)
    write_results(run_dir, summary)
    return summary


async def _run_sharded(
    options: EvalOptions, engine_url: str | None, specs: list[ExecutionSpec]
) -> list[ExecutionResult]:
    """The executions on ``options.shards`` runtime shards (at least one), on this machine or placed by Ray; each
    journals its own under ``journal/shards/NAME/`` and calls the one engine."""
    from gyre.config import GyreConfig
    from gyre.control.placement import Launcher, LocalLauncher, RayLauncher, ray_config
    from gyre.runtime.shard import RuntimeSpec
    from gyre.runtime.shards import ShardedRuntime, ShardHub

    rd = RunDir(options.run_dir)
    count = max(options.shards, 1)
    cfg = GyreConfig(router=RouterConfig(model_path=options.model_path, model_name=options.model_name),
                     sandbox=options.sandbox, shards=msgspec.structs.replace(options.shard_settings, count=count),
                     ray=options.placement)  # fmt: skip
    launcher: Launcher = LocalLauncher()
    if options.ray is not None:
        cfg = ray_config(cfg)
        launcher = RayLauncher(cfg, options.ray, rd.journal, cells=0)
    per_shard = -(-options.concurrency // count)
    runtimes = {"eval": RuntimeSpec(journal_dir=str(rd.journal), verifier_retries=options.verifier_retries,
                                    max_concurrency=per_shard)}  # fmt: skip
    try:
        async with ShardHub(cfg, rd.root, runtimes, launcher) as hub:
            if engine_url:
                hub.pool.add(engine_url, "engine-0", managed=False)
            return await _run_with_progress(ShardedRuntime(hub, "eval"), specs, options.progress)
    finally:
        await asyncio.to_thread(launcher.close)


async def _preflight(verifier: Verifier, tasks: list[Task], progress: bool) -> dict[str, str]:
    """Prepare each task's environment and check its grading can be faithful (`Verifier.preflight`); task id ->
    why it is refused. Environments already built are lookups."""
    from rich.progress import Progress, TimeElapsedColumn

    refused: dict[str, str] = {}
    columns = (*Progress.get_default_columns(), TimeElapsedColumn())
    with Progress(*columns, disable=not progress, transient=True) as bar:
        job = bar.add_task("preparing tasks (environments, clean collections)", total=len(tasks))
        for task in tasks:
            try:
                await verifier.preflight(task)
            except TaskError as exc:
                refused[task.id] = str(exc)
            bar.advance(job)
    return refused


REFUSAL_CHARS = 300  # of a refusal's reason in the results; the whole refusal is in its log


def _log_refusals(rd: RunDir, refused: dict[str, str]) -> dict[str, Refusal]:
    """Write each refusal whole to ``logs/refused/<task>.log`` (the tools' output lives there, never in the
    results); task id -> its one-line reason and that log."""
    found: dict[str, Refusal] = {}
    for task_id, why in refused.items():
        name = re.sub(r"[^\w.-]", "_", task_id) or "_"
        log = rd.logs / "refused" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(why if why.endswith("\n") else why + "\n")
        lines = why.strip().splitlines()
        reason = " ".join(lines[0].split()) if lines else "no reason given"
        if len(reason) > REFUSAL_CHARS:
            reason = reason[: REFUSAL_CHARS - 3] + "..."
        found[task_id] = Refusal(reason=reason, log=str(log.relative_to(rd.root)))
    return found


def _why_not(task: Task, options: EvalOptions) -> str:
    """Why this host cannot run or score ``task`` ("" when it can)."""
    from gyre.errors import TaskError

    try:
        Verifier(options.sandbox).check(task)
    except TaskError as exc:
        return task.unsupported or str(exc)
    return ""


def _router(options: EvalOptions, engine_url: str | None, journal: Path) -> Router:
    if options.base_url and options.agent != "oracle":
        import os

        from gyre.router.upstream import UpstreamRouter

        cfg = RouterConfig(model_name=options.model_name, journal_dir=str(journal))
        api_key = os.environ.get(options.api_key_env, "")
        return UpstreamRouter(cfg, options.base_url, api_key, model=options.model_name)
    cfg = RouterConfig(
        engines=[engine_url] if engine_url else [],
        model_path=options.model_path,
        model_name=options.model_name,
        journal_dir=str(journal),
    )
    return Router(cfg)


def agent_spec(agent: str, tasks: list[Task]) -> AgentSpec:
    """The agent ``builtin | oracle | command:ARGV | python:MODULE:ATTR`` names (oracle: every task needs a solution
    or an expert; python: the callable is imported now, so a bad name fails before anything starts)."""
    kind, _, rest = agent.partition(":")
    match kind:
        case "builtin":
            return BuiltinAgentSpec()
        case "oracle":
            lacking = [t.id for t in tasks if not t.solution_files and not t.expert]
            if lacking:
                raise ConfigError(
                    f"--agent oracle: tasks without a reference solution or scripted expert: {', '.join(lacking[:5])}"
                )
            return OracleAgentSpec()
        case "command":
            import shlex

            argv = shlex.split(rest)
            if not argv:
                raise ConfigError("--agent command:ARGV needs the scaffold's command line after 'command:'")
            return CommandAgentSpec(argv=argv)
        case "python":
            from gyre.agents.python import resolve

            if not rest:
                raise ConfigError(
                    "--agent python:TARGET needs a callable after 'python:': MODULE:ATTR or path/to/file.py:ATTR "
                    "(e.g. python:gyre.agents.frameworks:langgraph)"
                )
            return PythonAgentSpec(target=resolve(rest))
    raise ConfigError(
        f"--agent {agent!r}: expected builtin, oracle, command:ARGV or python:MODULE:ATTR (python:FILE.py:ATTR)"
    )


def _for_task(agent: AgentSpec, task: Task, options: EvalOptions) -> AgentSpec:
    """The agent for one task: a scripted expert plays through the built-in agent (the runtime caps its calls at the
    task's ``max_turns``)."""
    if isinstance(agent, OracleAgentSpec) and task.solution_files:
        return agent
    if isinstance(agent, OracleAgentSpec | BuiltinAgentSpec):
        config = BuiltinAgentConfig(
            max_steps=options.max_steps,
            temperature=options.temperature,
            max_tokens_per_call=options.max_tokens_per_call,
            profile=options.agent_profile,
            seed=options.seed,
            max_idle_calls=options.max_idle_calls,
        )
        return BuiltinAgentSpec(config=config)
    if isinstance(agent, PythonAgentSpec):  # the run's limits, for the callable to pass on to its framework
        return msgspec.structs.replace(
            agent,
            max_steps=options.max_steps,
            max_tokens=options.max_tokens_per_call,
            temperature=options.temperature,
        )
    return agent


@contextlib.asynccontextmanager
async def _serving(options: EvalOptions, tasks: list[Task]) -> AsyncIterator[str | None]:
    """The URL of an engine serving this evaluation, for as long as it runs (None: no model is needed)."""
    experts = sorted({t.expert for t in tasks if t.expert and not t.solution_files})
    if options.agent == "oracle" and not experts:  # reference solutions only: no model calls
        _ensure_model(options.model_path)  # the router still renders with its tokenizer
        yield None
        return
    if options.agent == "oracle":
        if len(experts) > 1:
            raise ConfigError(f"--agent oracle: one scripted expert per run, the suite has {experts}")
        from gyre.engine.models import load_tokenizer
        from gyre.engine.scripted import ScriptedEngine
        from gyre.tasks.catalog import expert

        _ensure_model(options.model_path)
        tokenizer = load_tokenizer(options.model_path)
        play = expert(options.expert or experts[0])
        with ScriptedEngine(tokenizer, lambda ids: play(str(tokenizer.decode(ids)))) as engine:
            yield engine.url
        return
    if options.engine_url or options.base_url:
        yield options.engine_url or None
        return
    from gyre.engine.launcher import launch_embedded

    _ensure_model(options.model_path)
    log = Path(options.run_dir) / "engine.log"
    threads = [f"engine.num_threads={options.engine_threads}"] if options.engine_threads else None
    host = "127.0.0.1"
    if options.ray is not None:  # the shards Ray places call it from their nodes
        from gyre.control.placement import ray_address

        host = ray_address()
    server = await asyncio.to_thread(launch_embedded, options.model_path, None, threads, log, host=host)
    try:
        yield server.url
    finally:
        await asyncio.to_thread(server.stop)


def _ensure_model(path: str) -> None:
    """Create the tiny model at ``path`` when it is the default and missing; anything else must exist."""
    if (Path(path) / "config.json").exists():
        return
    if Path(path) == Path("models/tiny"):
        from gyre.engine.models import init_model

        init_model(path, preset="tiny")
        print(
            f"gyre eval: no --model-path given and none at {path}: created the tiny model there "
            f"({Path(path).resolve()}; `gyre init-model` makes one); give --model-path for another",
            file=sys.stderr,
        )
        return
    raise ConfigError(f"model directory {path} not found (no config.json); give --model-path")


async def _run_with_progress(
    runtime: Runtime | ShardedRuntime, specs: list[ExecutionSpec], show: bool
) -> list[ExecutionResult]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    results: list[ExecutionResult | None] = [None] * len(specs)
    scores: list[float] = []
    progress = Progress(
        TextColumn("[bold]eval"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        disable=not show,
    )
    with progress:
        bar = progress.add_task("eval", total=len(specs), status="")

        async def one(i: int, spec: ExecutionSpec) -> None:
            result = await runtime.run_one(spec)
            results[i] = result
            if result.verdict is not None and result.verdict.trainable:
                scores.append(result.reward)
            outcomes = Counter(r.verdict.outcome for r in results if r is not None and r.verdict is not None)
            dropped, tampered = outcomes["dropped"], outcomes["tampered"]
            mean = sum(scores) / len(scores) if scores else 0.0
            running = runtime.statistics().running  # a shard's: as last reported
            progress.update(
                bar,
                advance=1,
                status=f"mean score {mean:.3f}  running {running}  dropped {dropped}  tampered {tampered}",
            )

        async with asyncio.TaskGroup() as group:
            for i, spec in enumerate(specs):
                group.create_task(one(i, spec))
    return [r for r in results if r is not None]


def summarize(
    options: EvalOptions,
    tasks: list[Task],
    results: list[ExecutionResult],
    unsupported: dict[str, str],
    wall_s: float,
    model: str,
    refused: dict[str, Refusal] | None = None,
) -> EvalSummary:
    """The summary of finished executions; ``unsupported`` and ``refused`` name the tasks that never ran."""
    rows = [_row(r) for r in results]
    counted = [r for r in rows if r.outcome in TRAINABLE_OUTCOMES]
    distribution = Counter(_bin(r.score) for r in counted)
    return EvalSummary(
        suite=options.suite,
        agent=options.agent,
        model=model,
        tasks=len(tasks),
        executions=len(rows),
        mean_score=statistics.fmean(r.score for r in counted) if counted else 0.0,
        mean_ci=bootstrap_ci([r.score for r in counted]),
        pass_rate=sum(r.score >= 1.0 for r in counted) / len(counted) if counted else 0.0,
        score_distribution={label: distribution.get(label, 0) for label in BIN_LABELS},
        outcomes=dict(Counter(r.outcome for r in rows)),
        statuses=dict(Counter(r.status for r in rows)),
        mean_calls=statistics.fmean(r.calls for r in rows) if rows else 0.0,
        mean_tokens=statistics.fmean(r.prompt_tokens + r.completion_tokens for r in rows) if rows else 0.0,
        wall_s=wall_s,
        tampered=sum(r.outcome == "tampered" for r in rows),
        unsupported=unsupported,
        refused=refused or {},
        rows=rows,
        counted=len(counted),
        dropped=sum(r.outcome == "dropped" for r in rows),
        # an expert chosen in place of the suite's (an impatient one) is not held to a perfect score
        problems=_problems(
            rows,
            oracle=options.agent == "oracle" and not options.expert,
            group_size=options.group_size,
            not_run=unsupported,
            refused=refused,
        ),
    )


def _problems(
    rows: list[ExecutionRow],
    oracle: bool,
    group_size: int = 1,
    not_run: dict[str, str] | None = None,
    refused: dict[str, Refusal] | None = None,
) -> list[str]:
    """What makes these figures untrustworthy as they stand, one line each: every task that did not run (refused or
    unsupported here: the figures are not over the suite), every dropped execution and, when the agent is the
    oracle, every reference solution that did not score 1 (its task is broken)."""
    found: list[str] = []
    if not rows:
        found.append("nothing ran: no task of the suite could run on this host")
    for task_id, why in sorted((not_run or {}).items()):
        found.append(f"{task_id}: not run: {_brief(why)}")
    for task_id, refusal in sorted((refused or {}).items()):
        found.append(f"{task_id}: refused: {refusal.reason} (log: {refusal.log})")
    for r in rows:
        name = r.task_id if group_size == 1 else f"{r.task_id} (execution {r.group_index})"
        if r.outcome == "dropped":
            found.append(f"{name}: dropped ({r.status}), left out of the mean: {_tail(r.detail or r.error)}")
        elif oracle and r.outcome == "tampered":
            why = _tail(r.detail or r.error)
            found.append(f"{name}: the reference solution was judged tampered, so the task is broken: {why}")
        elif oracle and r.score < 1.0:  # `error` is then the execution's own (a crash)
            why = _tail(" / ".join(x for x in (r.error, r.detail) if x)) or "no detail"
            tests = f", {r.passed}/{r.declared} tests" if r.passed is not None else ""
            found.append(
                f"{name}: the reference solution scored {r.score:.3f} ({r.status}, {r.outcome}{tests}): {why}"
            )
    return found


def _brief(text: str, head: int = 300, tail: int = 300) -> str:
    """``text`` on one line, its start (what was refused and why) and its end (where a command's output says what
    failed) kept when it is long."""
    line = " ".join(text.split())
    return line if len(line) <= head + tail else f"{line[:head]} ... {line[-tail:]}"


def _tail(text: str | None, chars: int = 300) -> str:
    """The end of ``text`` on one line (whitespace runs collapsed): where a verifier's output says what failed."""
    line = " ".join((text or "").split())
    return line if len(line) <= chars else "..." + line[-chars:]


def headline(s: EvalSummary) -> str:
    """The mean, its interval and the pass rate, with what they are over and what was left out."""
    left_out = [f"{s.dropped} dropped"]
    if unscored := s.outcomes.get("unscored", 0):
        left_out.append(f"{unscored} unscored")
    tampered = f" (incl. {s.tampered} tampered, scored 0)" if s.tampered else ""
    return (
        f"mean {s.mean_score:.3f} (95% CI {s.mean_ci[0]:.3f}-{s.mean_ci[1]:.3f}), pass rate {s.pass_rate:.1%}, "
        f"over {s.counted} scored{tampered} of {s.executions} executions; {', '.join(left_out)}"
    )


def bootstrap_ci(
    scores: list[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """A percentile bootstrap interval of the mean of ``scores`` (executions resampled with replacement); a single
    score or none gives a zero-width interval at the mean."""
    if len(scores) < 2:
        mean = scores[0] if scores else 0.0
        return mean, mean
    rng, n = random.Random(seed), len(scores)
    means = sorted(statistics.fmean(rng.choices(scores, k=n)) for _ in range(resamples))
    tail = (1 - confidence) / 2
    return means[int(tail * (resamples - 1))], means[round((1 - tail) * (resamples - 1))]


class Paired(msgspec.Struct, frozen=True, kw_only=True):
    """The mean of ``after - before`` over the executions both evaluations scored, with its 95% interval."""

    mean: float
    ci_low: float
    ci_high: float
    pairs: int

    @property
    def clear(self) -> bool:
        """``after`` beat ``before`` beyond the interval: its lower end is above 0."""
        return self.ci_low > 0.0


def scores_by_execution(summary: EvalSummary) -> dict[str, float]:
    """``task/k`` -> score of each scored execution of an evaluation (what `paired_difference` pairs)."""
    return {f"{r.task_id}/{r.group_index}": r.score for r in summary.rows if r.outcome in TRAINABLE_OUTCOMES}


def paired_difference(before: dict[str, float], after: dict[str, float], seed: int = 0) -> Paired:
    """``after - before`` over the keys (``task/k``) both hold: with the same tasks and the same sampling seeds,
    the differences cancel what the tasks and the draws share, so the interval is that of the effect."""
    keys = sorted(before.keys() & after.keys())
    diffs = [after[k] - before[k] for k in keys]
    low, high = bootstrap_ci(diffs, seed=seed)
    return Paired(mean=statistics.fmean(diffs) if diffs else 0.0, ci_low=low, ci_high=high, pairs=len(diffs))


def _row(r: ExecutionResult) -> ExecutionRow:
    v = r.verdict
    return ExecutionRow(
        task_id=r.task_id,
        group_index=r.group_index,
        status=r.status,
        outcome=v.outcome if v is not None else "unscored",
        score=r.reward,
        passed=v.passed if v is not None else None,
        declared=v.declared if v is not None else None,
        calls=r.calls,
        prompt_tokens=r.prompt_tokens,
        completion_tokens=r.completion_tokens,
        wall_s=r.finished_s - r.started_s,
        error=r.error or (v.detail[:500] if v is not None and v.outcome in ("dropped", "tampered") else None),
        detail=v.detail[-1000:] if v is not None else "",
    )


def _bin(score: float) -> str:
    if score <= 0:
        return "0"
    if score >= 1:
        return "1"
    upper = next(b for b in SCORE_BINS[1:] if score <= b)
    return "(0.75, 1)" if upper == 1.0 else f"({upper - 0.25:g}, {upper:g}]"


def write_results(run_dir: Path, summary: EvalSummary) -> None:
    """``results.json``, ``results.md`` and ``scores.png`` in ``run_dir``."""
    (run_dir / "results.json").write_bytes(msgspec.json.format(msgspec.json.encode(summary)))
    (run_dir / "results.md").write_text(markdown(summary))
    plot_scores(summary, run_dir / "scores.png")


def markdown(s: EvalSummary) -> str:
    """The summary as a Markdown report: headline figures, the distribution, one row per execution."""
    lines = [
        f"# gyre eval: {s.suite} ({s.agent}, model {s.model})",
        "",
        f"**{headline(s)}**",
        "",
        *(["## Not a clean run", "", *[f"- {p}" for p in s.problems], ""] if s.problems else []),
        "| tasks | executions | scored | dropped | mean score | 95% CI | pass rate | tampered | mean calls | "
        "mean tokens | wall time |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {s.tasks} | {s.executions} | {s.counted} | {s.dropped} | {s.mean_score:.3f} | "
        f"{s.mean_ci[0]:.3f}-{s.mean_ci[1]:.3f} | {s.pass_rate:.1%} | {s.tampered} | {s.mean_calls:.1f} | "
        f"{s.mean_tokens:,.0f} | {s.wall_s:.1f} s |",
        "",
        "Outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(s.outcomes.items())),
        "Statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(s.statuses.items())),
        "",
        "| score | executions |",
        "|---|---:|",
        *[f"| {label} | {n} |" for label, n in s.score_distribution.items()],
        "",
        "| task | # | status | outcome | score | passed/declared | calls | tokens | wall s |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in s.rows:
        tests = f"{r.passed}/{r.declared}" if r.passed is not None else ""
        lines.append(
            f"| {r.task_id} | {r.group_index} | {r.status} | {r.outcome} | {r.score:.3f} | {tests} | {r.calls} | "
            f"{r.prompt_tokens + r.completion_tokens:,} | {r.wall_s:.1f} |"
        )
    if s.refused:  # one line each: the tools' output is in the log it names
        lines += ["", "## Refused at preflight", ""]
        lines += [f"- {k}: {r.reason} (log: [{r.log}]({r.log}))" for k, r in sorted(s.refused.items())]
    if s.unsupported:
        lines += ["", "## Not run (unsupported on this host)", ""]
        lines += [f"- {k}: {_brief(v)}" for k, v in sorted(s.unsupported.items())]
    return "\n".join(lines) + "\n"


def plot_scores(s: EvalSummary, path: Path) -> None:
    """A histogram of scores and scores against calls per execution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    labels = list(s.score_distribution)
    left.bar(range(len(labels)), list(s.score_distribution.values()), color="#4c72b0")
    left.set_xticks(range(len(labels)), labels, rotation=20)
    left.set_xlabel("score")
    left.set_ylabel("executions")
    left.set_title(
        f"{s.suite}: mean {s.mean_score:.3f}, pass rate {s.pass_rate:.0%}\n"
        f"over {s.counted} scored of {s.executions} executions, {s.dropped} dropped"
    )
    scored = [r for r in s.rows if r.outcome in TRAINABLE_OUTCOMES]
    right.scatter([r.calls for r in scored], [r.score for r in scored], alpha=0.6, color="#dd8452")
    right.set_xlabel("model calls in the execution")
    right.set_ylabel("score")
    right.set_ylim(-0.05, 1.05)
    right.set_title("score against horizon")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


PIPE_WIDTH = 200  # columns of the summary when it is not printed on a terminal (the table needs about 140)


def print_summary(s: EvalSummary, run_dir: str) -> None:
    """The headline figures and where the files are, on the terminal."""
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"gyre eval: {s.suite} ({s.agent})")
    for column in ("tasks", "executions", "scored", "dropped", "mean score", "95% CI", "pass rate", "placeholders",
                   "tampered", "mean calls", "mean tokens", "wall time"):  # fmt: skip
        table.add_column(column, justify="right", overflow="fold")  # a narrow terminal: wrapped, never cut
    table.add_row(
        str(s.tasks), str(s.executions), str(s.counted), str(s.dropped), f"{s.mean_score:.3f}",
        f"{s.mean_ci[0]:.3f}-{s.mean_ci[1]:.3f}", f"{s.pass_rate:.1%}",
        str(s.outcomes.get("placeholder", 0)), str(s.tampered),
        f"{s.mean_calls:.1f}",
        f"{s.mean_tokens:,.0f}", f"{s.wall_s:.1f} s",
    )  # fmt: skip
    # on a terminal, its width (a narrow one folds the cells, never cuts them); otherwise (a pipe, a log file) wide
    # enough for the whole table, where rich would draw 80 columns
    console = Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)
    console.print(table)
    console.print(Text(headline(s), style="bold"))
    if s.unsupported or s.refused:
        logs = f"; each refusal whole in {run_dir}/logs/refused/" if s.refused else ""
        console.print(f"{len(s.unsupported) + len(s.refused)} task(s) not run (refused, or unsupported here): "
                      f"see results.md{logs}")  # fmt: skip
    if s.tampered and s.agent != "oracle":  # the oracle's are among the problems
        console.print(Text(f"{s.tampered} execution(s) tampered with the grader (scored 0): see results.md",
                           style="bold yellow"))  # fmt: skip
    console.print(f"results: {run_dir}/results.md, results.json, scores.png; journal: {run_dir}/journal/")
    if s.problems:
        what = "every reference solution must score 1 and " if s.agent == "oracle" else ""
        console.print(Panel(Text("\n".join(f"- {p}" for p in s.problems)), border_style="red",
                            title=f"not a clean run: {len(s.problems)} problem(s)",
                            subtitle=f"{what}no execution may be dropped"))  # fmt: skip

"""`gyre quickstart`: an agent that gets better because Gyre trained it, on a laptop's CPU, and says whether it did.

The recipe, every phase a real Gyre command on the ``toy`` suite and the built-in agent's lean profile (bash and
submit, a one-line prompt) throughout, so demonstrations, evaluations and training see one prompt:

0. the starting model: the tiny model pretrained on shell sessions (`gyre.driver.pretrain`: it can copy a name a command
   printed into the next command, as a pretrained LLM can; it has never seen a tool call). Shipped with Gyre, made
   by a committed script (`gyre pretrain`); its SFT and RL are what the quickstart shows;
1. demonstrations: the scripted expert solves ``demo_suite(seed)`` through the real stack (`gyre eval --agent
   oracle`);
2. the starting model on the fixed held-out set ``EVAL_SUITE`` (`gyre eval`): the floor;
3. `gyre sft` on the demonstrations' whole sessions: the tool-call format and where the copied name goes;
4. `gyre train` (elastic, 2 cells) from the SFT checkpoint, its weights and its AdamW moments
   (``trainer.optimizer_from``), evaluating the held-out set before its first step and after its last.

All three evaluations run the same tasks with the same sampling seed (``run.eval_seed``): each execution draws the
same random numbers under each phase's weights, so each phase is compared with the one before pairwise, execution by
execution (`gyre.driver.evaluation.paired_difference`), with a 95% interval of the mean difference. The verdict: learned
when SFT beat the starting model and RL beat SFT beyond their intervals, else which phase failed and the likeliest
reason (`judge`). ``--seed`` varies everything after the shipped checkpoint: the demonstrated tasks, SFT's order,
RL's tasks and sampling, the held-out sampling.

Everything lands in one directory: ``demos/``, ``eval-base/``, ``sft/``, ``train/`` (its report has the learning
curve) and ``quickstart.json`` (`QuickstartSummary`).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import msgspec

from gyre.config import GyreConfig, load_config
from gyre.driver.evaluation import EvalOptions, Paired, paired_difference, run_eval, scores_by_execution
from gyre.driver.eventloop import run as run_loop
from gyre.driver.rundir import RunDir, default_run_dir, execution_journals
from gyre.driver.sft import run_sft
from gyre.driver.training import EvalPoint, StepRecord, train
from gyre.journal import read_journal
from gyre.runtime.dispatch import ExecutionResult
from gyre.tasks.catalog import resolve_suite

EVAL_SUITE = "toy:64:7"  # the held-out set: 64 tasks no phase trains on
TRAIN_SUITE = "toy:256:1"
TRAIN_TEMPERATURE = 0.7  # RL samples at it (the trainer takes log-probabilities at it too)
# The held-out evaluations sample as RL does. At 1.0 the SFT point (0.416, 0.34-0.50) sat on the first-call floor
# (0.360): sampling slips in ~70-token calls cost more than the demonstrator's impatience.
EVAL_TEMPERATURE = 0.7
# The demonstrator: the scripted expert, impatient (it gives up at each name with probability 0.2): SFT learns the
# skill and the impatience, RL on the score outgrows the demonstrator (BENCHMARKS.md, "Quickstart").
EXPERT = "toy-chain-impatient"
MAX_CALLS = 16  # the agent's model calls per execution
MAX_TOKENS = 96  # per call (a call of the expert's is ~73 tokens)
# Every phase's agent gives up after 2 calls in a row that call no tool (the nudge after the first lets a trained
# model's sampling slip recover). The starting model has never seen a tool call: uncapped, its held-out evaluation
# took 226 s of an 18-minute fresh run (issue 45) to score 0.000.
MAX_IDLE_CALLS = 2
# RL's learning rate: at 1e-3 the training reward rose 0.23 -> 0.59 in 4 steps, then collapsed to 0.05 in two
RL_LEARNING_RATE = 3e-4


def demo_suite(seed: int, short: bool) -> str:
    """The demonstrated tasks: another draw for each quickstart seed, never the held-out or the RL tasks."""
    return f"toy:{80 if short else 200}:{100 + seed}"


class Point(msgspec.Struct, frozen=True, kw_only=True):
    """One evaluation of the held-out set."""

    phase: str  # base | sft | rl
    mean: float
    ci_low: float
    ci_high: float
    pass_rate: float
    executions: int
    well_formed: float  # share of its executions whose first call held a well-formed tool call


class Gain(Paired, frozen=True, kw_only=True):
    """A phase against the one before, execution by execution on the same tasks and sampling seeds."""

    before: str
    after: str


class QuickstartSummary(msgspec.Struct, frozen=True, kw_only=True):
    """``quickstart.json``."""

    run_dir: str
    seed: int
    short: bool
    model: str  # the starting model
    points: list[Point]  # base, sft, rl
    gains: list[Gain]  # sft - base, rl - sft
    floor: float  # the held-out mean of "only the first call right" (the fixed `cat start`)
    rl_rewards: list[float]  # training reward of each RL step
    groups: int  # RL's task groups, and those whose executions all scored alike (no signal)
    flat_groups: int
    seconds: dict[str, float]  # phase -> wall seconds
    total_s: float
    learned: bool
    failed: str  # "" | "sft" | "rl": the first phase that did not beat the one before
    verdict: str  # what happened, in words


def recipe(run_dir: Path, model_path: str, short: bool = False, seed: int = 0) -> GyreConfig:
    """The configuration of the SFT and RL phases. ``short``: a CI-sized version on the same code path (fewer
    demonstrations, SFT steps, RL steps and held-out tasks)."""

    def quoted(value: object) -> str:  # a TOML string, whatever the path holds
        return json.dumps(str(value))

    overrides = [
        f"sft.model_path={quoted(model_path)}", f"sft.journals=[{quoted(run_dir / 'demos')}]",
        f"sft.output_dir={quoted(run_dir / 'sft')}", f"sft.epochs={4 if short else 3}", "sft.batch_sessions=8",
        "sft.window_tokens=384", 'sft.window_focus=["output"]', "sft.window_steps=60",
        "sft.window_batch=32",
        "sft.learning_rate=3e-3", "sft.lr_warmup_steps=5", f"sft.seed={seed}", "trainer.num_threads=2",
        f"trainer.seed={seed}", f'run.suite="{TRAIN_SUITE}"', f"run.run_dir={quoted(run_dir / 'train')}",
        f"run.seed={seed}", f"run.steps={2 if short else 6}", "run.tasks_per_step=8", "run.group_size=4",
        'run.agent_profile="lean"', f"run.agent_max_calls={MAX_CALLS}", f"run.agent_max_tokens={MAX_TOKENS}",
        f"run.agent_max_idle_calls={MAX_IDLE_CALLS}",
        f"run.agent_temperature={TRAIN_TEMPERATURE}", f'run.eval_suite="{EVAL_SUITE}"',
        f"run.eval_tasks={eval_tasks(short)}", f"run.eval_temperature={EVAL_TEMPERATURE}", f"run.eval_seed={seed}",
        "cells.count=2", "cells.capacity_executions=16", "cells.num_threads=1",
        f'cells.engine_overrides=["engine.kv_cache_mem_gib=0.5", "engine.seed={seed}"]',
        f"trainer.learning_rate={RL_LEARNING_RATE}",
    ]  # fmt: skip
    return load_config(None, overrides)


def eval_tasks(short: bool) -> int:
    return 16 if short else 64


def first_call_floor(tasks: int) -> float:
    """The held-out mean of an agent that only makes the fixed first call right: each chain's first name of
    ``length + 1`` trail entries."""
    held_out = resolve_suite(EVAL_SUITE)[:tasks]
    return statistics.fmean(1 / (int(t.metadata["chain_length"]) + 1) for t in held_out)


def quickstart(run_dir: str | Path | None = None, model_path: str | None = None, short: bool = False,
               progress: bool = True, seed: int = 0) -> QuickstartSummary:  # fmt: skip
    """Run the recipe (see the module) into ``run_dir``; returns the three evaluations, the gains and the verdict.
    ``model_path``: the starting model (default: the shipped pretrained tiny model, written to ``models/``)."""
    from gyre.driver.pretrain import shipped_model

    root = Path(run_dir or default_run_dir("quickstart", "toy")).absolute()
    root.mkdir(parents=True, exist_ok=True)
    model = str(model_path or shipped_model())
    seconds: dict[str, float] = {}
    started = time.monotonic()

    def timed(phase: str, since: float) -> None:
        seconds[phase] = time.monotonic() - since

    t = time.monotonic()
    demos = EvalOptions(suite=demo_suite(seed, short), run_dir=str(root / "demos"), agent="oracle", expert=EXPERT,
                        agent_profile="lean", model_path=model, concurrency=16, progress=progress)  # fmt: skip
    demonstrated = run_eval(demos)
    if not demonstrated.ok:  # SFT on broken demonstrations would teach the breakage
        raise RuntimeError(
            "the expert's demonstrations are not clean: " + "; ".join(demonstrated.problems[:5])
        )
    timed("demonstrations", t)
    t = time.monotonic()
    cfg = recipe(root, model, short, seed)
    run = cfg.run
    # the base point is scored as `gyre train` scores the other two: same tasks, limits, temperature and seeds
    base = run_eval(EvalOptions(suite=run.eval_suite, limit=run.eval_tasks, run_dir=str(root / "eval-base"),
                                agent_profile=run.agent_profile, model_path=model, max_steps=run.agent_max_calls,
                                max_tokens_per_call=run.agent_max_tokens, max_idle_calls=run.agent_max_idle_calls,
                                concurrency=16, engine_threads=2,
                                temperature=EVAL_TEMPERATURE, seed=run.eval_seed, progress=progress))  # fmt: skip
    timed("base eval", t)
    t = time.monotonic()
    sft = run_sft(cfg, progress=progress)
    timed("sft", t)
    # RL starts from SFT's weights and AdamW moments: a fresh Adam's first updates (every weight moved by about the
    # learning rate) broke the call format at 1e-3 (BENCHMARKS.md, "Quickstart")
    cfg = msgspec.structs.replace(cfg, run=msgspec.structs.replace(cfg.run, model_path=sft.checkpoint),
                                  trainer=msgspec.structs.replace(cfg.trainer, optimizer_from=sft.checkpoint))  # fmt: skip
    t = time.monotonic()
    trained = run_loop(train(cfg))
    timed("rl", t)

    tokenizer = _tokenizer(model)
    rd = RunDir(trained.run_dir)
    evals = sorted(read_journal(rd.eval, EvalPoint), key=lambda e: e.step)
    held_out = [r for p in execution_journals(rd.eval_journal) for r in read_journal(p, ExecutionResult)]
    base_calls = list(read_journal(RunDir(root / "eval-base").executions, ExecutionResult))
    points = [Point(phase="base", mean=base.mean_score, ci_low=base.mean_ci[0], ci_high=base.mean_ci[1],
                    pass_rate=base.pass_rate, executions=base.executions,
                    well_formed=well_formed(base_calls, tokenizer))]  # fmt: skip
    for phase, e in (("sft", evals[0]), ("rl", evals[-1])):
        mine = [r for r in held_out if r.execution_id.startswith(f"eval-{e.step}/")]
        points.append(Point(phase=phase, mean=e.mean, ci_low=e.ci_low, ci_high=e.ci_high, pass_rate=e.pass_rate,
                            executions=e.executions, well_formed=well_formed(mine, tokenizer)))  # fmt: skip
    gains = [
        _gain("base", "sft", paired_difference(scores_by_execution(base), evals[0].scores)),
        _gain("sft", "rl", paired_difference(evals[0].scores, evals[-1].scores, seed=1)),
    ]
    steps = list(read_journal(rd.metrics, StepRecord))
    floor = first_call_floor(run.eval_tasks)
    groups, flat = sum(s.groups for s in steps), sum(s.flat_groups for s in steps)
    learned, failed, verdict = judge(points, gains, floor, groups, flat)
    summary = QuickstartSummary(
        run_dir=str(root), seed=seed, short=short, model=model, points=points, gains=gains, floor=floor,
        rl_rewards=[s.reward_mean for s in steps], groups=groups, flat_groups=flat, seconds=seconds,
        total_s=time.monotonic() - started, learned=learned, failed=failed, verdict=verdict,
    )  # fmt: skip
    (root / "quickstart.json").write_bytes(msgspec.json.format(msgspec.json.encode(summary)))
    return summary


def _gain(before: str, after: str, paired: Paired) -> Gain:
    return Gain(before=before, after=after, **msgspec.structs.asdict(paired))


def _tokenizer(model: str):  # type: ignore[no-untyped-def]
    from gyre.engine.models import load_tokenizer

    return load_tokenizer(model)


def well_formed(results: list[ExecutionResult], tokenizer) -> float:  # type: ignore[no-untyped-def]
    """The share of the executions whose first model call held a well-formed tool call (as the router parses
    replies; the first call is the fixed ``cat start``, so this is the call format alone); 0.0 without any."""
    from gyre.router.messages import parse_tool_calls

    firsts = [r.records[0].output_ids for r in results if r.records]
    good = sum(
        bool(parse_tool_calls(tokenizer.decode(ids, skip_special_tokens=True)).tool_calls) for ids in firsts
    )
    return good / len(firsts) if firsts else 0.0


def judge(points: list[Point], gains: list[Gain], floor: float, groups: int, flat_groups: int
          ) -> tuple[bool, str, str]:  # fmt: skip
    """(learned, the phase that failed or "", the verdict in words). Learned: SFT beat the starting model and
    the first-call floor, and RL beat SFT, each beyond its 95% interval (paired, execution by execution)."""
    base, sft, rl = points
    to_sft, to_rl = gains

    def gain(g: Gain) -> str:
        return (
            f"{g.mean:+.3f} (95% interval {g.ci_low:+.3f} to {g.ci_high:+.3f}, {g.pairs} paired executions)"
        )

    if not to_sft.clear or sft.pass_rate == 0.0 or sft.ci_low <= floor:
        if sft.well_formed < 0.5:
            why = (f"the tool-call format is broken: {1 - sft.well_formed:.0%} of its executions' first calls held no "
                   "well-formed tool call")  # fmt: skip
        elif sft.pass_rate == 0.0 or sft.ci_low <= floor:
            why = (f"its first calls are well formed ({sft.well_formed:.0%}) but it does not follow the chains to "
                   f"their end: no better than making only the first call right (floor {floor:.3f}, pass rate "
                   f"{sft.pass_rate:.0%}); it copies wrong names or submits before the end")  # fmt: skip
        else:
            why = "its gain is within the noise of the held-out set"
        return False, "sft", f"Not learned: SFT did not beat the starting model: {gain(to_sft)}; {why}."
    if not to_rl.clear:
        if groups and flat_groups == groups:
            why = (
                "no reward signal: every group of RL executions scored alike, so every advantage was 0 and "
                "RL trained nothing"
            )
        elif rl.well_formed < sft.well_formed - 0.2:
            why = f"RL broke the tool-call format (well-formed first calls {sft.well_formed:.0%} -> {rl.well_formed:.0%})"
        elif to_rl.ci_high < 0:
            why = "RL made the agent worse"
        else:
            why = (
                f"RL's gain is within the noise of the held-out set ({flat_groups} of {groups} groups had no "
                "reward signal)"
            )
        return False, "rl", f"Not learned: SFT beat the starting model by {gain(to_sft)}, but RL did not beat " \
                            f"SFT: {gain(to_rl)}; {why}."  # fmt: skip
    return True, "", (f"Learned: SFT beat the starting model by {gain(to_sft)}, and RL beat SFT by {gain(to_rl)}; "
                      f"held-out mean {base.mean:.3f} -> {sft.mean:.3f} -> {rl.mean:.3f}.")  # fmt: skip

"""``report.html`` of a run directory: one self-contained page (plots inlined as PNG, no scripts) that opens offline.

Read from what the run journaled, so ``gyre report RUN_DIR`` rebuilds it at any time, also for a run still going
or one that was killed: ``metrics.jsonl`` (a line per applied step), ``journal/executions.jsonl`` (every
execution's reward), ``switches.jsonl`` (every role switch, timed per phase), ``eval.jsonl`` (a line per held-out
evaluation), ``timeline.jsonl`` (the driver's sample of cells and executions, about once a second) and
``train.json`` (the finished run's summary). Any file may be missing, and a line written before a field existed
reads with the field's default; a plot without data is left out and named on the page as not drawn. A torn last
line is skipped.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec

from gyre.driver.rundir import RunDir, execution_journals
from gyre.journal import read_journal
from gyre.protocol import StepMetrics, SwitchRecord

ROLE_COLOURS = {"serving": "#4c78a8", "training": "#f58518", "switching": "#bab0ac"}


class _Step(msgspec.Struct, frozen=True, kw_only=True):  # the fields of training.StepRecord the report reads
    step: int
    wall_s: float  # since the run started
    reward_mean: float
    reward_std: float
    pass_rate: float
    executions: int
    dropped: int
    trainer: StepMetrics
    at_s: float = 0.0  # wall clock; 0 in lines from before the field
    execution_ids: list[str] = msgspec.field(default_factory=list)  # whose data trained in this step
    sampled_tokens: int = 0  # completion tokens those executions generated


class _Execution(msgspec.Struct, frozen=True, kw_only=True):  # of runtime.ExecutionResult
    execution_id: str
    reward: float = 0.0
    dispatched_s: float = 0.0
    finished_s: float = 0.0


class _Eval(msgspec.Struct, frozen=True, kw_only=True):  # of training.EvalPoint (eval.jsonl)
    step: int  # steps applied when evaluated
    mean: float
    ci_low: float  # 95% interval of the mean
    ci_high: float
    version: int = -1
    pass_rate: float = 0.0
    executions: int = 0
    at_s: float = 0.0


class _Sample(msgspec.Struct, frozen=True, kw_only=True):  # of control.loop.LoopSample (timeline.jsonl)
    at_s: float  # wall clock
    in_flight: int = 0  # executions running: the water level
    ready: int = 0
    serving: int = 0  # cells in each role
    training: int = 0
    switching: int = 0
    idle_cells: float = 0.0  # cells' worth of idle capacity
    cells: int = 0
    version: int = -1


class _Divergence(msgspec.Struct, frozen=True):  # of records.Divergence
    kind: str = ""


class _Call(msgspec.Struct, frozen=True, kw_only=True):  # the fields of records.CallRecord the report reads
    parent_call_id: str | None = None
    divergence: _Divergence | None = None


class _Summary(
    msgspec.Struct, frozen=True
):  # of training.TrainSummary (train.json, written when the run ends)
    idle_fraction: float | None = None


def write_report(run_dir: str | Path) -> Path:
    """Write ``run_dir/report.html`` from the run's journals; returns its path."""
    run = RunDir(run_dir)
    steps = _read(run.metrics, _Step)
    executions = [e for path in execution_journals(run.journal) for e in _read(path, _Execution)]
    switches = _read(run.switches, SwitchRecord)
    evals = _read(run.eval, _Eval)
    timeline = _read(run.timeline, _Sample)
    calls = _read(run.calls, _Call)
    summary = (
        msgspec.json.decode(run.summary.read_bytes(), type=_Summary) if run.summary.exists() else _Summary()
    )
    idle = summary.idle_fraction if summary.idle_fraction is not None else _idle_fraction(timeline)
    start = _run_start(steps, executions, switches, timeline)
    end = max(
        [s.at_s for s in steps] + [e.finished_s for e in executions] + [t.at_s for t in timeline],
        default=start,
    )
    figures = [
        ("Reward per step", _rewards(steps)),
        ("Partial-score distribution per step", _scores(steps, executions)),
        ("Held-out eval (95% interval)", _evals(evals)),
        ("Cell roles over time", _roles(switches, start, end)),
        ("Cells by role, utilisation and idle", _utilisation(timeline, start, idle)),
        ("Water level: executions in flight", _water_level(timeline, steps, start)),
        ("Switch durations by phase", _switch_phases(switches)),
        ("Tokens sampled vs trained per step", _tokens(steps)),
        ("Staleness and loss per step", _staleness(steps)),
    ]
    body = "".join(
        f"<h2>{html.escape(title)}</h2><img alt='{html.escape(title)}' src='data:image/png;base64,{png}'>"
        for title, png in figures
        if png
    )
    missing = [title for title, png in figures if not png]
    if missing:
        body += f"<p>Not drawn, nothing journaled for them yet: {html.escape(', '.join(missing))}.</p>"
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Gyre run {html.escape(run.root.name)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}img{{max-width:100%}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}</style></head>
<body><h1>Gyre run {html.escape(run.root.name)}</h1>
<p>{len(steps)} steps applied, {len(executions)} executions, {len(switches)} role switches, {len(evals)} held-out
evaluations{f"; cells idle {idle:.0%} of the time" if idle is not None else ""}.</p>
{_chains(calls)}{body}{_eval_table(evals)}{_step_table(steps)}</body></html>"""
    run.report.write_text(page, encoding="utf-8")
    return run.report


def _chains(calls: list[_Call]) -> str:
    """How the calls chained: a later call extends the earlier one token-exactly, or starts a new branch; where
    the chat template's own render of an earlier reply differs from what the model produced, the record says so."""
    if not calls:
        return ""
    branches = sum(c.parent_call_id is None for c in calls)
    kinds: dict[str, int] = defaultdict(int)
    for c in calls:
        if c.divergence is not None:
            kinds[c.divergence.kind] += 1
    where = ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items())) or "none"
    return (f"<p>Model calls: {len(calls)}, of which {len(calls) - branches} extend an earlier call and {branches} "
            f"start a branch. Inputs that differ from the chat template's own render (divergences, by kind): "
            f"{html.escape(where)}. See the Models page of the manual for what each kind means.</p>")  # fmt: skip


def _read(path: Path, type_: Any) -> list[Any]:
    return list(read_journal(path, type_)) if path.exists() else []


def _run_start(steps: list[_Step], executions: list[_Execution], switches: list[SwitchRecord],
               timeline: list[_Sample]) -> float:  # fmt: skip
    """Wall clock of the run's start: x = 0 of every plot over time."""
    known = [s.at_s - s.wall_s for s in steps if s.at_s]
    if known:
        return min(known)
    seen = [s.started for s in switches] + [e.dispatched_s for e in executions if e.dispatched_s]
    return min(seen + [t.at_s for t in timeline], default=0.0)


def _idle_fraction(timeline: list[_Sample]) -> float | None:
    """Idle share of the cells' capacity over the timeline, each sample weighted by the time until the next."""
    if not timeline:
        return None
    weights = [b.at_s - a.at_s for a, b in itertools.pairwise(timeline)] or [1.0]
    cells = sum(t.cells * w for t, w in zip(timeline, weights, strict=False))
    return sum(t.idle_cells * w for t, w in zip(timeline, weights, strict=False)) / cells if cells else None


def scores_by_step(trained: dict[int, list[str]], rewards: dict[str, float]) -> dict[int, list[float]]:
    """Each step's partial scores: the rewards of the executions it trained on (steps naming none left out)."""
    found = {step: [rewards[i] for i in ids if i in rewards] for step, ids in trained.items()}
    return {step: scores for step, scores in found.items() if scores}


def _step_table(steps: list[_Step]) -> str:
    rows = "".join(
        f"<tr><td>{s.step}</td><td>{s.reward_mean:.3f} ± {s.reward_std:.3f}</td><td>{s.pass_rate:.0%}</td>"
        f"<td>{s.executions}</td><td>{s.dropped}</td><td>{s.trainer.loss:.4f}</td><td>{s.sampled_tokens:,}</td>"
        f"<td>{s.trainer.tokens:,}</td><td>{s.trainer.staleness_mean:.2f}</td><td>{s.trainer.seconds:.1f}</td>"
        f"<td>{s.wall_s:.1f}</td></tr>"
        for s in steps
    )
    return f"""<h2>Steps</h2><table id="steps"><thead><tr><th>step</th><th>reward</th><th>pass</th>
<th>executions</th><th>dropped</th><th>loss</th><th>sampled tokens</th><th>trained tokens</th><th>staleness</th>
<th>step s</th><th>wall s</th></tr></thead><tbody>{rows}</tbody></table>"""


def _eval_table(evals: list[_Eval]) -> str:
    if not evals:
        return ""
    rows = "".join(
        f"<tr><td>{e.step}</td><td>{e.version}</td><td>{e.mean:.3f}</td><td>{e.ci_low:.3f} – {e.ci_high:.3f}</td>"
        f"<td>{e.pass_rate:.0%}</td><td>{e.executions}</td></tr>"
        for e in evals
    )
    return f"""<h2>Held-out evaluations</h2><table id="evals"><thead><tr><th>step</th><th>version</th>
<th>mean</th><th>95% interval</th><th>pass</th><th>executions</th></tr></thead><tbody>{rows}</tbody></table>"""


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def _figure(height: float = 3.2, columns: int = 1) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, columns, figsize=(10, height))


def _rewards(steps: list[_Step]) -> str:
    if not steps:
        return ""
    fig, ax = _figure()
    xs = [s.step for s in steps]
    ax.errorbar(xs, [s.reward_mean for s in steps], yerr=[s.reward_std for s in steps], marker="o", capsize=3,
                label="mean ± std")  # fmt: skip
    ax.plot(xs, [s.pass_rate for s in steps], marker="s", label="pass rate")
    ax.set_xlabel("step")
    ax.set_ylabel("reward (partial score)")
    ax.set_ylim(-0.05, 1.05)
    ax.legend()
    return _png(fig)


def _scores(steps: list[_Step], executions: list[_Execution]) -> str:
    scores = scores_by_step(
        {s.step: s.execution_ids for s in steps}, {e.execution_id: e.reward for e in executions}
    )
    if not scores:
        return ""
    fig, ax = _figure()
    xs = list(scores)
    ax.boxplot(list(scores.values()), positions=xs, widths=0.6, showfliers=False, manage_ticks=False)
    for x, values in scores.items():  # every execution a dot, spread sideways so equal scores stay visible
        spread = [x + 0.5 * ((k * 0.618) % 1 - 0.5) for k in range(len(values))]
        ax.scatter(spread, values, s=10, alpha=0.5, color=ROLE_COLOURS["serving"])
    ax.set_xlabel("step")
    ax.set_ylabel("partial score per execution")
    ax.set_ylim(-0.05, 1.05)
    return _png(fig)


def _evals(evals: list[_Eval]) -> str:
    if not evals:
        return ""
    fig, ax = _figure()
    xs = [e.step for e in evals]
    means = [e.mean for e in evals]
    ax.fill_between(
        xs, [e.ci_low for e in evals], [e.ci_high for e in evals], alpha=0.25, label="95% interval"
    )
    ax.errorbar(xs, means, yerr=[[m - e.ci_low for m, e in zip(means, evals, strict=True)],
                                 [e.ci_high - m for m, e in zip(means, evals, strict=True)]],
                marker="o", capsize=3, label="mean reward")  # fmt: skip
    ax.plot(xs, [e.pass_rate for e in evals], marker="s", linestyle="--", label="pass rate")
    ax.set_xlabel("steps applied")
    ax.set_ylabel("held-out reward")
    ax.set_ylim(-0.05, 1.05)
    ax.legend()
    return _png(fig)


def _roles(switches: list[SwitchRecord], start: float, end: float) -> str:
    if not switches:
        return ""
    end = max([end] + [s.started + s.total_s for s in switches])
    by_cell: dict[str, list[SwitchRecord]] = defaultdict(list)
    for s in sorted(switches, key=lambda s: s.started):
        by_cell[s.cell].append(s)
    fig, ax = _figure(1.2 + 0.5 * len(by_cell))
    for row, (_, records) in enumerate(sorted(by_cell.items())):
        role, since = "serving", start
        for s in records:
            ax.broken_barh([(since - start, s.started - since)], (row - 0.4, 0.8), color=ROLE_COLOURS[role])
            ax.broken_barh(
                [(s.started - start, s.total_s)], (row - 0.4, 0.8), color=ROLE_COLOURS["switching"]
            )
            role = "training" if s.direction == "serve_to_train" else "serving"
            since = s.started + s.total_s
        ax.broken_barh([(since - start, max(end - since, 0))], (row - 0.4, 0.8), color=ROLE_COLOURS[role])
    ax.set_yticks(range(len(by_cell)), sorted(by_cell))
    ax.set_xlabel("seconds since the run started (blue: serving, orange: training, grey: switching)")
    return _png(fig)


def _utilisation(timeline: list[_Sample], start: float, idle: float | None) -> str:
    if not timeline:
        return ""
    fig, (left, right) = _figure(columns=2)
    xs = [t.at_s - start for t in timeline]
    roles = list(ROLE_COLOURS)
    left.stackplot(xs, *[[getattr(t, role) for t in timeline] for role in roles], labels=roles,
                   colors=[ROLE_COLOURS[r] for r in roles], step="post")  # fmt: skip
    left.plot(
        xs, [t.idle_cells for t in timeline], color="black", linestyle="--", label="idle (cells' worth)"
    )
    left.set_xlabel("seconds since the run started")
    left.set_ylabel("cells")
    left.legend(fontsize=7)
    right.fill_between(xs, [t.idle_cells / t.cells if t.cells else 0.0 for t in timeline], step="post",
                       alpha=0.4, color="grey", label="idle share of capacity")  # fmt: skip
    if idle is not None:
        right.axhline(idle, color="black", linestyle=":", label=f"run: {idle:.0%} idle")
    right.set_xlabel("seconds since the run started")
    right.set_ylim(0, 1.05)
    right.legend(fontsize=7)
    return _png(fig)


def _water_level(timeline: list[_Sample], steps: list[_Step], start: float) -> str:
    if not timeline:
        return ""
    fig, ax = _figure()
    xs = [t.at_s - start for t in timeline]
    ax.step(xs, [t.in_flight for t in timeline], where="post", label="in flight (water level)")
    ax.step(xs, [t.ready for t in timeline], where="post", label="ready for training")
    applied = [s.at_s - start for s in steps if s.at_s]
    if applied:
        ax.vlines(applied, 0, 1, transform=ax.get_xaxis_transform(), colors="grey", linewidth=0.5,
                  label="step applied")  # fmt: skip
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("executions")
    ax.legend(fontsize=7)
    return _png(fig)


def _switch_phases(switches: list[SwitchRecord]) -> str:
    if not switches:
        return ""
    fig, ax = _figure()
    phases = list(dict.fromkeys(p for s in switches for p in s.phases))
    bottom = [0.0] * len(switches)
    for phase in phases:
        values = [s.phases.get(phase, 0.0) for s in switches]
        ax.bar(range(len(switches)), values, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xticks(range(len(switches)), [f"{s.cell}\n{'→T' if s.direction == 'serve_to_train' else '→S'}"
                                         for s in switches], fontsize=6)  # fmt: skip
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7, ncol=4)
    return _png(fig)


def _tokens(steps: list[_Step]) -> str:
    if not steps:
        return ""
    fig, ax = _figure()
    xs = [s.step for s in steps]
    bars = [("computed", [s.trainer.computed_tokens for s in steps]),
            ("trained (weighted)", [s.trainer.tokens for s in steps])]  # fmt: skip
    if any(s.sampled_tokens for s in steps):  # lines from before the field have none
        bars.insert(0, ("sampled (completion)", [s.sampled_tokens for s in steps]))
    width = 0.8 / len(bars)
    for k, (label, values) in enumerate(bars):
        ax.bar([x + (k - (len(bars) - 1) / 2) * width for x in xs], values, width=width, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("tokens")
    ax.legend(fontsize=7)
    return _png(fig)


def _staleness(steps: list[_Step]) -> str:
    if not steps:
        return ""
    fig, (left, right) = _figure(columns=2)
    xs = [s.step for s in steps]
    left.plot(xs, [s.trainer.staleness_mean for s in steps], marker="o", label="mean")
    left.plot(xs, [s.trainer.staleness_max for s in steps], marker="^", linestyle="--", label="max")
    left.set_xlabel("step")
    left.set_ylabel("staleness (versions behind)")
    left.legend(fontsize=7)
    right.plot(xs, [s.trainer.loss for s in steps], marker="s", color="#54a24b")
    right.set_xlabel("step")
    right.set_ylabel("loss")
    return _png(fig)

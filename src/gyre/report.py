"""``report.html`` of a run directory: one self-contained page (plots inlined as PNG, no scripts) that opens offline.

Read from what the run journaled, so ``gyre report RUN_DIR`` rebuilds it at any time, also for a run still going or
one that was killed: ``metrics.jsonl`` (a line per applied step), ``journal/executions.jsonl`` (every execution's
reward) and ``switches.jsonl`` (every role switch, timed per phase). A torn last line is skipped.
"""

from __future__ import annotations

import base64
import html
import io
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec

from gyre.journal import read_journal
from gyre.protocol import StepMetrics, SwitchRecord

ROLE_COLOURS = {"serving": "#4c78a8", "training": "#f58518", "switching": "#bab0ac"}


class _Step(msgspec.Struct, frozen=True, kw_only=True):  # the fields of training.StepRecord the report reads
    step: int
    wall_s: float
    reward_mean: float
    reward_std: float
    pass_rate: float
    executions: int
    dropped: int
    trainer: StepMetrics
    at_s: float = 0.0


class _Execution(msgspec.Struct, frozen=True, kw_only=True):  # of runtime.ExecutionResult
    execution_id: str
    reward: float = 0.0
    dispatched_s: float = 0.0
    finished_s: float = 0.0


def write_report(run_dir: str | Path) -> Path:
    """Write ``run_dir/report.html`` from the run's journals; returns its path."""
    run = Path(run_dir)
    steps = _read(run / "metrics.jsonl", _Step)
    executions = _read(run / "journal" / "executions.jsonl", _Execution)
    switches = _read(run / "switches.jsonl", SwitchRecord)
    figures = [
        ("Reward per step", _rewards(steps, executions)),
        ("Cell roles over time", _roles(switches, executions, max((s.at_s for s in steps), default=0.0))),
        ("Switch durations by phase", _switch_phases(switches)),
        ("Training: tokens, staleness, loss", _training(steps)),
    ]
    rows = "".join(
        f"<tr><td>{s.step}</td><td>{s.reward_mean:.3f} ± {s.reward_std:.3f}</td><td>{s.pass_rate:.0%}</td>"
        f"<td>{s.executions}</td><td>{s.dropped}</td><td>{s.trainer.loss:.4f}</td><td>{s.trainer.tokens:,}</td>"
        f"<td>{s.trainer.staleness_mean:.2f}</td><td>{s.trainer.seconds:.1f}</td><td>{s.wall_s:.1f}</td></tr>"
        for s in steps
    )
    body = "".join(
        f"<h2>{html.escape(title)}</h2><img alt='{html.escape(title)}' src='data:image/png;base64,{png}'>"
        for title, png in figures
        if png
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Gyre run {html.escape(run.name)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}img{{max-width:100%}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}</style></head>
<body><h1>Gyre run {html.escape(run.name)}</h1>
<p>{len(steps)} steps applied, {len(executions)} executions, {len(switches)} role switches.</p>
<table><tr><th>step</th><th>reward</th><th>pass</th><th>executions</th><th>dropped</th><th>loss</th>
<th>tokens</th><th>staleness</th><th>step s</th><th>wall s</th></tr>{rows}</table>{body}</body></html>"""
    out = run / "report.html"
    out.write_text(page, encoding="utf-8")
    return out


def _read(path: Path, type_: Any) -> list[Any]:
    return list(read_journal(path, type_)) if path.exists() else []


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


def _rewards(steps: list[_Step], executions: list[_Execution]) -> str:
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


def _roles(switches: list[SwitchRecord], executions: list[_Execution], last_step_at: float) -> str:
    if not switches:
        return ""
    start = min([s.started for s in switches] + [e.dispatched_s for e in executions if e.dispatched_s])
    end = max([s.started + s.total_s for s in switches] + [e.finished_s for e in executions] + [last_step_at])
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
    ax.set_xlabel("seconds (blue: serving, orange: training, grey: switching)")
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


def _training(steps: list[_Step]) -> str:
    if not steps:
        return ""
    fig, (left, right) = _figure(columns=2)
    xs = [s.step for s in steps]
    left.bar([x - 0.2 for x in xs], [s.trainer.computed_tokens for s in steps], width=0.4, label="computed")
    left.bar([x + 0.2 for x in xs], [s.trainer.tokens for s in steps], width=0.4, label="trained (weighted)")
    left.set_xlabel("step")
    left.set_ylabel("tokens")
    left.legend(fontsize=7)
    right.plot(xs, [s.trainer.staleness_mean for s in steps], marker="o", label="staleness (versions)")
    right.plot(xs, [s.trainer.loss for s in steps], marker="s", label="loss")
    right.set_xlabel("step")
    right.legend(fontsize=7)
    return _png(fig)

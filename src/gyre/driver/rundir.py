"""A run directory: where `gyre eval` and `gyre train` keep everything a run produced, under one layout.

::

    RUN_DIR/
      config.toml            the resolved configuration (gyre train) / options.json (gyre eval)
      journal/calls.jsonl    every model call, token-exact (the router's journal)
      journal/executions.jsonl  every finished execution with its records and verdict (the runtime's)
      journal/resumes.jsonl  one line per `gyre train --resume`: where it picked up
      switches.jsonl         every role switch of a cell, timed per phase
      metrics.jsonl          one line per applied step (`training.StepRecord`)
      eval.jsonl             one line per held-out evaluation (`training.EvalPoint`), eval/ its executions
      timeline.jsonl         about once a second: water level, cells per role, idle capacity
      checkpoints/step-N/    Hugging Face weights + optimizer state after N steps
      logs/                  one log per cell (and engine)
      tensorboard/           event files (``tensorboard --logdir RUN_DIR/tensorboard``)
      train.json, report.html  the summary and the report (gyre train); results.* (gyre eval)

Every ``*.jsonl`` is append-only and written a whole line at a time (`gyre.journal`); a process killed mid-write
leaves at most a torn last line, which readers skip and `RunDir.repair` cuts off before anything appends again.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from gyre.journal import repair_journal

_CHECKPOINT = re.compile(r"^step-(\d+)$")


def default_run_dir(kind: str, name: str) -> Path:
    """``runs/<kind>-<name>-<time>`` (``name``: a suite spec, made path-safe)."""
    safe = name.replace("/", "_").replace(":", "-")
    return Path("runs") / f"{kind}-{safe}-{time.strftime('%Y%m%d-%H%M%S')}"


class RunDir:
    """The paths of one run directory (see the module) and what resuming needs from them."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(os.path.abspath(root))  # cells and journals in other directories find it too
        self.config = self.root / "config.toml"
        self.journal = self.root / "journal"
        self.calls = self.journal / "calls.jsonl"
        self.executions = self.journal / "executions.jsonl"
        self.resumes = self.journal / "resumes.jsonl"
        self.switches = self.root / "switches.jsonl"
        self.metrics = self.root / "metrics.jsonl"
        self.eval = self.root / "eval.jsonl"
        self.eval_journal = self.root / "eval"
        self.timeline = self.root / "timeline.jsonl"
        self.checkpoints = self.root / "checkpoints"
        self.logs = self.root / "logs"
        self.tensorboard = self.root / "tensorboard"
        self.summary = self.root / "train.json"
        self.report = self.root / "report.html"

    def checkpoint(self, step: int) -> Path:
        """Where the checkpoint after ``step`` applied steps lives."""
        return self.checkpoints / f"step-{step}"

    def latest_checkpoint(self) -> int:
        """The most steps a complete checkpoint holds (0: none). A checkpoint is complete once its directory has its
        final name (the trainer writes ``step-N.partial`` and renames it)."""
        steps = [
            int(m.group(1))
            for p in (self.checkpoints.iterdir() if self.checkpoints.is_dir() else [])
            if (m := _CHECKPOINT.match(p.name)) and (p / "trainer_state.json").is_file()
        ]
        return max(steps, default=0)

    def journals(self) -> list[Path]:
        """Every JSON-lines file of the run."""
        return sorted(p for p in self.root.rglob("*.jsonl") if p.is_file())

    def repair(self) -> dict[str, int]:
        """Cut the torn last line off every journal (a crash mid-write); returns file -> bytes cut, cut ones only."""
        cut = {str(p.relative_to(self.root)): repair_journal(p) for p in self.journals()}
        return {name: n for name, n in cut.items() if n}

    @staticmethod
    def replace(path: Path, data: bytes) -> None:
        """Make ``data`` the content of ``path`` atomically (a new file renamed over it): a crash leaves the old
        content or the new, never a mix."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


def execution_journals(base: str | Path) -> list[Path]:
    """Every executions journal under a journal directory ``base`` (``journal/``, ``eval/``): the driver's own,
    then each runtime shard's (``shards/NAME/executions.jsonl``, `gyre.runtime.shards`); existing ones only."""
    base = Path(base)
    return [
        p for p in [base / "executions.jsonl", *sorted(base.glob("shards/*/executions.jsonl"))] if p.is_file()
    ]

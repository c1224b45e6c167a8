"""Task environments and grading of real NL2RepoBench tasks: preparation cold vs cached, and verification (issue 15).

    python benchmarks/task_environments.py [--tasks retrying,parse,...] [--uv-cold]

For each task of ``tests/data/nl2repobench`` (real tasks, their hidden tests rebuilt from the upstream projects):

- **cold**: its environment built into an empty Gyre cache (uv's own download cache stays warm unless
  ``--uv-cold``, which gives uv an empty one too: every wheel comes from the registry);
- **cached**: the same preparation again (a lookup of the content-addressed manifest);
- **preflight**: the grader's clean collection of the hidden tests over the reference solution;
- **verify**: one verification of the reference workspace (a fresh sandbox over the environment, the task's
  commands verbatim, ``pip install -e .`` offline into the sandbox's layer, pytest under the grader), with its
  declared and observed counts.

Prints the side-by-side table and writes ``benchmarks/results/task_environments.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gyre.config import SandboxConfig
from gyre.tasks import environments
from gyre.tasks.formats import load_task
from gyre.tasks.verify import Verifier

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "data" / "nl2repobench"
RESULTS = Path(__file__).resolve().parent / "results" / "task_environments.json"


async def measure(name: str, cfg: SandboxConfig) -> dict[str, object]:
    task = load_task(FIXTURES / name)
    assert task.environment is not None
    t = time.monotonic()
    done, built = await asyncio.to_thread(environments.prepare, task.environment, cfg)
    cold = time.monotonic() - t
    t = time.monotonic()
    _, built_again = await asyncio.to_thread(environments.prepare, task.environment, cfg)
    cached = time.monotonic() - t
    assert built and not built_again
    verifier = Verifier(cfg, retries=0)
    t = time.monotonic()
    await verifier.preflight(task)
    preflight = time.monotonic() - t
    with tempfile.TemporaryDirectory(prefix="gyre-bench-ws-") as tmp:
        ws = Path(tmp)
        for rel, data in {**task.files, **task.solution_files}.items():
            (ws / rel).parent.mkdir(parents=True, exist_ok=True)
            (ws / rel).write_bytes(data if isinstance(data, bytes) else data.encode())
        t = time.monotonic()
        verdict = await verifier.verify(task, ws)
        verify = time.monotonic() - t
    return {
        "task": name, "packages": len(done.installed), "cold_s": round(cold, 2), "cached_s": round(cached, 4),
        "preflight_s": round(preflight, 2), "verify_s": round(verify, 2), "score": verdict.score,
        "outcome": verdict.outcome, "declared": verdict.declared, "passed": verdict.passed, "failed": verdict.failed,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    names = sorted(p.name for p in FIXTURES.iterdir() if (p / "start.md").is_file())
    parser.add_argument("--tasks", default=",".join(names), help="comma-separated fixture names")
    parser.add_argument("--uv-cold", action="store_true", help="uv's download cache empty too")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gyre-bench-envs-") as cache:
        if args.uv_cold:
            os.environ["UV_CACHE_DIR"] = str(Path(cache) / "uv")
        cfg = SandboxConfig(env_cache_dir=str(Path(cache) / "envs"))
        for name in args.tasks.split(","):
            rows.append(asyncio.run(measure(name, cfg)))
            environments.forget()
        shutil.rmtree(cache, ignore_errors=True)
    table = Table(title="Task environments: preparation cold vs cached, and verification of the reference")
    for column in ("task", "packages", "cold s", "cached s", "cold / cached", "preflight s", "verify s", "score",
                   "declared", "passed", "failed"):  # fmt: skip
        table.add_column(column, justify="right")
    for r in rows:
        ratio = float(r["cold_s"]) / max(float(r["cached_s"]), 1e-4)  # type: ignore[arg-type]
        table.add_row(str(r["task"]), str(r["packages"]), f"{r['cold_s']:.2f}", f"{r['cached_s']:.4f}", f"{ratio:,.0f}x",
                      f"{r['preflight_s']:.1f}", f"{r['verify_s']:.1f}", f"{r['score']:.3f}", str(r["declared"]),
                      str(r["passed"]), str(r["failed"]))  # fmt: skip
    Console().print(table)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"uv_cold": args.uv_cold, "rows": rows}, indent=2) + "\n")
    print(f"written: {RESULTS}")


if __name__ == "__main__":
    main()

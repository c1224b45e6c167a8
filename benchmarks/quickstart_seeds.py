"""Does the quickstart learn on every seed? Runs `gyre quickstart --seed N` for several seeds, one after another (each
uses the whole machine), and prints one table: per seed each phase's held-out mean, interval and pass rate, the
paired gains (SFT over the starting model, RL over SFT) with their 95% intervals, the seconds, and the verdict.

    python benchmarks/quickstart_seeds.py --seeds 5 [--first 0] [--short] [--out runs/quickstart-seeds]

A seed whose run crashed is reported as such and counts as not learned. Writes ``seeds.json``, ``seeds.md`` (the
table as BENCHMARKS.md shows it) and ``seeds.png`` (each seed's three phases and the gains) into ``--out``; exits
non-zero unless every seed's SFT beat the starting model and at least all but one seed's RL beat SFT.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def run_seed(seed: int, out: Path, short: bool) -> dict[str, Any]:
    """One quickstart in its own process, as a user runs it; its quickstart.json (or why there is none)."""
    run_dir = out / f"seed-{seed}"
    argv = [sys.executable, "-m", "gyre", "quickstart", "--seed", str(seed), "--run-dir", str(run_dir),
            "--no-progress", *(["--short"] if short else [])]  # fmt: skip
    started = time.monotonic()
    with open(out / f"seed-{seed}.log", "w") as log:
        code = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT)
    summary = run_dir / "quickstart.json"
    if not summary.exists():
        return {"seed": seed, "crashed": f"exit {code}, see {out / f'seed-{seed}.log'}",
                "total_s": time.monotonic() - started}  # fmt: skip
    return {"exit": code, **json.loads(summary.read_text())}


def rows(results: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in results:
        if "crashed" in r:
            out.append([str(r["seed"]), "crashed", "", "", "", "", f"{r['total_s'] / 60:.1f}", r["crashed"]])
            continue
        points = {p["phase"]: p for p in r["points"]}
        gains = {g["after"]: g for g in r["gains"]}
        out.append([str(r["seed"]), *(_point(points[p]) for p in ("base", "sft", "rl")),
                    *(_gain(gains[p]) for p in ("sft", "rl")),
                    f"{r['total_s'] / 60:.1f}", "learned" if r["learned"] else f"not learned ({r['failed']})"])  # fmt: skip
    return out


def _point(p: dict[str, Any]) -> str:
    return f"{p['mean']:.3f} ({p['ci_low']:.2f}-{p['ci_high']:.2f}), {p['pass_rate']:.0%}"


def _gain(g: dict[str, Any]) -> str:
    return f"{g['mean']:+.3f} ({g['ci_low']:+.3f} to {g['ci_high']:+.3f})"


HEADER = ["seed", "start: mean (95%), pass", "SFT", "RL", "SFT - start (paired)", "RL - SFT (paired)", "minutes",
          "verdict"]  # fmt: skip


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in results if "crashed" not in r]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for r in done:
        means = [p["mean"] for p in r["points"]]
        left.plot(["start", "SFT", "RL"], means, marker="o", label=f"seed {r['seed']}")
    left.set_ylabel("held-out mean partial score")
    left.set_ylim(0, 1)
    left.legend()
    for k, phase in enumerate(("sft", "rl")):
        for i, r in enumerate(done):
            g = next(g for g in r["gains"] if g["after"] == phase)
            x = k + (i - len(done) / 2) * 0.08
            right.errorbar(x, g["mean"], yerr=[[g["mean"] - g["ci_low"]], [g["ci_high"] - g["mean"]]], fmt="o",
                           color=f"C{i}")  # fmt: skip
    right.axhline(0, color="grey", lw=0.8)
    right.set_xticks([0, 1], ["SFT - start", "RL - SFT"])
    right.set_ylabel("paired gain, 95% interval")
    fig.suptitle("gyre quickstart, one run per seed")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--short", action="store_true", help="the CI-sized quickstart")
    parser.add_argument("--out", type=Path, default=Path("runs/quickstart-seeds"))
    args = parser.parse_args()
    taken = [args.out / f"seed-{s}" for s in range(args.first, args.first + args.seeds)
             if (args.out / f"seed-{s}").exists()]  # fmt: skip
    if taken:  # a quickstart refuses a used run directory, and its old summary would pass for a new one
        parser.error(f"{', '.join(map(str, taken))} already exist: choose a fresh --out")
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console()
    results: list[dict[str, Any]] = []
    for seed in range(args.first, args.first + args.seeds):
        console.print(f"seed {seed}: gyre quickstart --seed {seed} ...")
        results.append(run_seed(seed, args.out, args.short))
        r = results[-1]
        console.print(f"  {r.get('verdict') or r.get('crashed')}", highlight=False)
    table = Table(title=f"gyre quickstart{' --short' if args.short else ''}, {len(results)} seeds")
    for column in HEADER:
        table.add_column(column, justify="right")
    for row in rows(results):
        table.add_row(*row)
    console.print(table)
    sft_ok = sum(1 for r in results if "crashed" not in r and r["failed"] != "sft")
    rl_ok = sum(1 for r in results if "crashed" not in r and r["learned"])
    minutes = ", ".join(f"{r['total_s'] / 60:.1f}" for r in results)
    line = (f"SFT beat the starting model on {sft_ok} of {len(results)} seeds; RL beat SFT on {rl_ok} of "
            f"{len(results)}; minutes {minutes}")  # fmt: skip
    console.print(line)
    (args.out / "seeds.json").write_text(json.dumps(results, indent=1))
    markdown = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    markdown += ["| " + " | ".join(row) + " |" for row in rows(results)]
    (args.out / "seeds.md").write_text("\n".join([*markdown, "", line, ""]))
    plot(results, args.out / "seeds.png")
    console.print(f"{args.out / 'seeds.md'}, {args.out / 'seeds.png'}")
    return 0 if sft_ok == len(results) and rl_ok >= len(results) - 1 else 1


if __name__ == "__main__":
    sys.exit(main())

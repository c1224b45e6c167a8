"""``gyre sim``: run a workload in every mode, print the comparison, plot the cells' roles, vary the costs.

Modes compared at the same cell budget on the same executions: ``elastic`` with single-step bursts (the paper's),
``elastic`` with cross-burst overlap, ``async`` tuned (the best fixed number of training cells) and with half the
cells training (an untuned split), ``colocate``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec

from gyre.config import convert
from gyre.control.policy import PolicyConfig
from gyre.errors import ConfigError
from gyre.sim.simulate import SimResult, Workload, simulate

WORKLOADS = Path(__file__).parent / "workloads"  # shipped workload files


def load_workload(path: str | Path) -> Workload:
    """A workload from TOML (``[cluster]``, ``[tasks]``): a file, or the name of a shipped one (``paper``)."""
    file = Path(path)
    if not file.exists() and (WORKLOADS / f"{path}.toml").exists():
        file = WORKLOADS / f"{path}.toml"
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        shipped = ", ".join(sorted(p.stem for p in WORKLOADS.glob("*.toml")))
        raise ConfigError(f"workload {path} does not exist (shipped: {shipped})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file} is not valid TOML: {exc}") from None
    return convert(data, Workload, str(file))


def compare(workload: Workload, max_staleness: int = 1) -> dict[str, SimResult]:
    """Every mode on ``workload``; async with its best number of training cells."""
    policies = {
        "elastic (single-step bursts)": PolicyConfig(
            mode="elastic", overlap=False, max_staleness=max_staleness
        ),
        "elastic (overlap)": PolicyConfig(mode="elastic", overlap=True, max_staleness=max_staleness),
        "colocate": PolicyConfig(mode="colocate", overlap=False, max_staleness=max_staleness),
    }
    out = {name: simulate(workload, cfg) for name, cfg in policies.items()}
    tries = [simulate(workload, PolicyConfig(mode="async", async_train_cells=k, max_staleness=max_staleness))
             for k in range(1, max(workload.cluster.cells, 2))]  # fmt: skip
    out["async (tuned)"] = min(tries, key=lambda r: r.total_s)
    out["async (half the cells train)"] = tries[max(workload.cluster.cells // 2, 1) - 1]
    return out


def speedups(results: dict[str, SimResult]) -> tuple[float, float]:
    """Elastic with overlap over tuned async and over colocate."""
    best = results["elastic (overlap)"].total_s
    return results["async (tuned)"].total_s / best, results["colocate"].total_s / best


def sensitivity(workload: Workload) -> list[tuple[str, float, float]]:
    """(variation, speed-up over async, over colocate) when switches cost more, tails are heavier, cells double."""
    cl, tk = workload.cluster, workload.tasks
    variations = {
        "as given": workload,
        "switch cost x10": msgspec.structs.replace(workload, cluster=msgspec.structs.replace(
            cl, serve_to_train_s=cl.serve_to_train_s * 10, train_to_serve_s=cl.train_to_serve_s * 10)),
        "switch cost x100": msgspec.structs.replace(workload, cluster=msgspec.structs.replace(
            cl, serve_to_train_s=cl.serve_to_train_s * 100, train_to_serve_s=cl.train_to_serve_s * 100)),
        "tail p99/p50 x2": msgspec.structs.replace(workload, tasks=msgspec.structs.replace(
            tk, duration_p99_over_p50=tk.duration_p99_over_p50 * 2)),
        "cells x2": msgspec.structs.replace(workload, cluster=msgspec.structs.replace(cl, cells=cl.cells * 2)),
    }  # fmt: skip
    rows = [(name, *speedups(compare(w))) for name, w in variations.items()]
    return [*rows, ("max_staleness 2", *speedups(compare(workload, max_staleness=2)))]


def cell_sweep(
    workload: Workload, counts: list[int], max_staleness: int = 1
) -> list[tuple[int, dict[str, SimResult]]]:
    """Every mode at each cell count (same executions): which mode, and how many cells, for this workload."""
    out = []
    for count in counts:
        cluster = msgspec.structs.replace(workload.cluster, cells=count)
        out.append((count, compare(msgspec.structs.replace(workload, cluster=cluster), max_staleness)))
    return out


def plot(results: dict[str, SimResult], path: Path) -> Path:
    """Each mode's cell roles over time (one panel per mode), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"serving": "#4c78a8", "training": "#f58518", "draining": "#bab0ac", "resuming": "#bab0ac"}
    fig, axes = plt.subplots(len(results), 1, figsize=(11, 1.2 + 0.9 * len(results) * 2), sharex=True)
    for ax, (name, result) in zip(axes, results.items(), strict=True):
        names = sorted({s.cell for s in result.timeline}, key=lambda n: (n.startswith("server"), len(n), n))
        for row, cell in enumerate(names):
            for s in (s for s in result.timeline if s.cell == cell):
                ax.broken_barh([(s.start_s / 3600, (s.end_s - s.start_s) / 3600)], (row - 0.4, 0.8),
                               color=colours.get(s.role, "#e45756"))  # fmt: skip
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.set_title(f"{name}: {result.total_s / 3600:.1f} h, idle {result.idle_fraction:.0%}", fontsize=9)
    axes[-1].set_xlabel("hours (blue: serving, orange: training, grey: switching)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

"""``gyre sim``: run a workload in every mode, print the comparison, plot the cells' roles, vary the costs.

Modes compared at the same cell budget on the same executions: ``elastic`` with single-step bursts (the paper's),
``elastic`` with cross-burst overlap; the baselines as a user would run them: ``async`` with the split that was
fastest on the run's first 10% of steps (each split tried there), with half the cells training, one-step
off-policy (``onestep``, its split chosen the same way), ``colocate``; and beside them the hindsight oracle (the
split that was fastest over the whole run, which no user can know in advance). ``lower_bound`` is the least time
any policy could take.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import msgspec

from gyre.config import convert
from gyre.control.policy import Mode, PolicyConfig
from gyre.errors import ConfigError
from gyre.sim.simulate import SimResult, Workload, durations, executions, simulate, stretched, training_costs

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


ELASTIC = "elastic (overlap)"
USER_ASYNC = "async (split from the first 10%)"
ORACLE = "async (hindsight oracle split)"
HALF = "async (half the cells train)"
ONESTEP = "one-step off-policy (split from the first 10%)"
COLOCATE = "colocate"
TRIAL_FRACTION = 0.1  # a user tries each split on this share of the run's steps, then keeps the best


class Bound(msgspec.Struct, frozen=True, kw_only=True):
    """The least time any policy allowed ``max_staleness`` could take (``lower_bound``)."""

    work_s: float  # the cells' work spread perfectly over the cells
    chain_s: float  # steps waiting for their slowest execution, one after another
    total_s: float  # the larger


def lower_bound(workload: Workload, max_staleness: int = 1, carry_over: bool = False) -> Bound:
    """A lower bound on a run's time, whatever the policy.

    Work: every execution holds one of a serving cell's ``capacity`` slots for its duration (plus its decoding at
    batch 1), every execution's micro-step holds a training cell, every step's update holds one; spread with no
    idle and no switch over the cells, less the lost cells' mean absence (and no cell both serves and trains at
    once). Chain: step k's executions cannot start before step ``k - max_staleness - 1`` is applied, so step k
    ends no earlier than that plus its slowest execution (through the bursts), its micro-step and the update;
    nor before step k - 1 ends plus its own training spread over every cell. With ``carry_over`` no step waits for
    given executions: only the work bounds the run (and the slowest execution). Tool-latency bursts (a share f of the
    time, sampling ``burst_slowdown`` times slower): at best the training fills the bursts and the sampling the
    rest, so the work also needs ``(sampling + training / slowdown) / (cells (1 - f + f / slowdown))``. Lost cells
    and bursts enter as their share of the time (over a run much longer than their period).
    """
    cl, tk, dr = workload.cluster, workload.tasks, workload.drift
    times = executions(workload)
    costs = training_costs(workload, times)
    decode = tk.turns * tk.tokens_per_call * cl.decode_step_s
    held = [min(t + decode, tk.budget_s + decode / max(tk.turns, 1)) for t in times]
    lost = 0.0
    if dr.outage_every_s and dr.outage_for_s:
        lost = min(dr.outage_cells, cl.cells - 1 + cl.standalone) * min(
            dr.outage_for_s / dr.outage_every_s, 1.0
        )
    sampling = sum(held) / cl.capacity
    training = sum(costs) + tk.steps * cl.apply_s
    n = cl.cells + cl.standalone - lost
    work = max((sampling + training) / n, training / max(cl.cells - lost, 1e-9))
    # with bursts, at best the training fills them
    if dr.burst_every_s and dr.burst_for_s and dr.burst_slowdown > 1:
        f, slow = min(dr.burst_for_s / dr.burst_every_s, 1.0), dr.burst_slowdown
        work = max(work, (sampling + training / slow) / (n * (1 - f + f / slow)))
    batch = tk.batch_executions
    ends: list[float] = []
    for k in range(tk.steps):
        items = range(k * batch, (k + 1) * batch)
        gate = ends[k - max_staleness - 1] if k > max_staleness else 0.0
        slowest = max(stretched(dr, gate, held[i]) + costs[i] for i in items) - gate + cl.apply_s
        own = max(sum(costs[i] for i in items) / cl.cells, max(costs[i] for i in items)) + cl.apply_s
        ends.append(max(gate + slowest, (ends[-1] if ends else 0.0) + own))
    chain = max(held[i] + costs[i] for i in range(len(held))) + cl.apply_s if carry_over else ends[-1]
    return Bound(work_s=work, chain_s=chain, total_s=max(work, chain))


def best_split(workload: Workload, mode: Mode = "async", max_staleness: int = 1, until_step: int | None = None,
               carry_over: bool = False) -> tuple[int, SimResult]:  # fmt: skip
    """The number of training cells that finishes ``until_step`` steps (all: hindsight) soonest, and its run."""
    tries = [
        simulate(
            workload,
            PolicyConfig(mode=mode, async_train_cells=k, max_staleness=max_staleness, carry_over=carry_over),
            until_step,
        )
        for k in range(1, max(workload.cluster.cells, 2))
    ]
    best = min(range(len(tries)), key=lambda k: tries[k].total_s)
    return best + 1, tries[best]


def user_split(
    workload: Workload, mode: Mode = "async", max_staleness: int = 1, carry_over: bool = False
) -> int:
    """The split a user would pick: each tried on the run's first 10% of steps, the fastest kept."""
    trial = max(math.ceil(TRIAL_FRACTION * workload.tasks.steps), 1)
    return best_split(workload, mode, max_staleness, trial, carry_over)[0]


def compare(workload: Workload, max_staleness: int = 1, carry_over: bool = False) -> dict[str, SimResult]:
    """Every mode and baseline on ``workload``, on the same executions; ``carry_over`` for every mode that streams
    (colocate samples nothing while it trains, so it has nothing to carry)."""

    def run(mode: Mode, k: int = 1, overlap: bool = True) -> SimResult:
        return simulate(workload, PolicyConfig(mode=mode, async_train_cells=k, overlap=overlap,
                                               max_staleness=max_staleness, carry_over=carry_over))  # fmt: skip

    def split(mode: Mode) -> int:
        return user_split(workload, mode, max_staleness, carry_over)

    return {
        "elastic (single-step bursts)": run("elastic", overlap=False),
        ELASTIC: run("elastic"),
        COLOCATE: run("colocate", overlap=False),
        USER_ASYNC: run("async", split("async")),
        ORACLE: best_split(workload, "async", max_staleness, carry_over=carry_over)[1],
        HALF: run("async", max(workload.cluster.cells // 2, 1)),
        ONESTEP: run("onestep", split("onestep")),
    }


class Speedups(msgspec.Struct, frozen=True, kw_only=True):
    """Elastic (overlap) against each baseline (their time over elastic's), and against the bound."""

    over_user_async: float
    over_oracle: float
    over_colocate: float
    over_onestep: float
    of_bound: float  # the bound's time over elastic's: 1.0 would be perfect
    idle: float


def speedups(results: dict[str, SimResult], bound: Bound | None = None) -> Speedups:
    """Elastic with overlap over each baseline of ``compare``."""
    best = results[ELASTIC].total_s
    return Speedups(
        over_user_async=results[USER_ASYNC].total_s / best, over_oracle=results[ORACLE].total_s / best,
        over_colocate=results[COLOCATE].total_s / best, over_onestep=results[ONESTEP].total_s / best,
        of_bound=bound.total_s / best if bound else 0.0, idle=results[ELASTIC].idle_fraction,
    )  # fmt: skip


def with_seed(workload: Workload, seed: int) -> Workload:
    """The same workload on other executions."""
    return msgspec.structs.replace(workload, tasks=msgspec.structs.replace(workload.tasks, seed=seed))


def sensitivity(workload: Workload) -> list[tuple[str, Speedups]]:
    """Elastic's speed-ups when switches cost more, tails are heavier, cells double, staleness is 2."""
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
    rows = [(name, speedups(compare(w), lower_bound(w))) for name, w in variations.items()]
    return [
        *rows,
        ("max_staleness 2", speedups(compare(workload, max_staleness=2), lower_bound(workload, 2))),
    ]


def cell_sweep(
    workload: Workload, counts: list[int], max_staleness: int = 1
) -> list[tuple[int, dict[str, SimResult]]]:
    """Every mode at each cell count (same executions): which mode, and how many cells, for this workload."""
    out = []
    for count in counts:
        cluster = msgspec.structs.replace(workload.cluster, cells=count)
        out.append((count, compare(msgspec.structs.replace(workload, cluster=cluster), max_staleness)))
    return out


def with_shape(workload: Workload, tail: float, training_share: float) -> Workload:
    """``workload`` with p99/p50 ``tail`` and the micro-step cost that makes training ``training_share`` of the
    cells' work (the bound's work terms)."""
    tasks = msgspec.structs.replace(workload.tasks, duration_p99_over_p50=tail)
    shaped = msgspec.structs.replace(workload, tasks=tasks)
    cl, tk = shaped.cluster, shaped.tasks
    times = durations(tk, shaped.drift)
    unit = training_costs(msgspec.structs.replace(shaped, cluster=msgspec.structs.replace(cl, micro_step_s=1.0)),
                          times)  # fmt: skip
    decode = tk.turns * tk.tokens_per_call * cl.decode_step_s
    sampling = sum(min(t + decode, tk.budget_s + decode) for t in times) / cl.capacity
    training = training_share / (1 - training_share) * sampling
    micro = max((training - tk.steps * cl.apply_s) / sum(unit), 1e-3)
    return msgspec.structs.replace(shaped, cluster=msgspec.structs.replace(cl, micro_step_s=micro))


def speedup_map(workload: Workload, tails: list[float], shares: list[float], max_staleness: int = 1,
                seeds: int = 1) -> list[list[float]]:  # fmt: skip
    """Elastic's speed-up over async with the split a user picks, per (tail, training share), mean over seeds."""
    grid = []
    for tail in tails:
        row = []
        for share in shares:
            ratios = []
            for seed in range(seeds):
                shaped = with_seed(with_shape(workload, tail, share), workload.tasks.seed + seed)
                split = user_split(shaped, "async", max_staleness)
                policy = PolicyConfig(mode="async", async_train_cells=split, max_staleness=max_staleness)
                fixed = simulate(shaped, policy)
                elastic = simulate(shaped, PolicyConfig(mode="elastic", max_staleness=max_staleness))
                ratios.append(fixed.total_s / elastic.total_s)
            row.append(sum(ratios) / len(ratios))
        grid.append(row)
    return grid


def plot_map(
    grid: list[list[float]], tails: list[float], shares: list[float], title: str, path: Path
) -> Path:
    """The speed-up map as a heat map (PNG): tail weight down, training share across."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(shares), 1.2 + 0.7 * len(tails)))
    image = ax.imshow(grid, cmap="RdYlGn", vmin=0.7, vmax=1.6, origin="lower", aspect="auto")
    for r, row in enumerate(grid):
        for c, value in enumerate(row):
            ax.text(c, r, f"{value:.2f}x", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(shares)), [f"{s:.0%}" for s in shares])
    ax.set_yticks(range(len(tails)), [f"{t:g}" for t in tails])
    ax.set_xlabel("training's share of the cells' work")
    ax.set_ylabel("execution tail (p99 / p50)")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label="elastic over async (user's split)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


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

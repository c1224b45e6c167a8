"""The simulator: deterministic, every step completes, each mode keeps its promises, and the comparison holds."""

from __future__ import annotations

import itertools
from pathlib import Path

import msgspec
import pytest

from gyre.cli import main
from gyre.control import PolicyConfig
from gyre.errors import ConfigError
from gyre.sim import Cluster, Tasks, Workload, simulate
from gyre.sim.report import compare, load_workload, speedups

SMALL = Workload(
    cluster=Cluster(cells=4, capacity=8, micro_step_s=120.0, apply_s=30.0),
    tasks=Tasks(
        steps=8, batch_executions=16, duration_median_s=900.0, duration_p99_over_p50=10.0, budget_s=7200.0
    ),
)


@pytest.mark.parametrize("mode", ["elastic", "colocate", "async"])
def test_every_mode_finishes_every_step_deterministically(mode: str) -> None:
    cfg = PolicyConfig(mode=mode)  # type: ignore[arg-type]
    first, again = simulate(SMALL, cfg), simulate(SMALL, cfg)
    assert first == again
    assert len(first.step_end_s) == 8 and first.step_end_s == sorted(first.step_end_s)
    assert 0.0 <= first.idle_fraction <= 1.0
    assert first.staleness_max <= cfg.max_staleness
    covered = {s.cell for s in first.timeline}
    assert covered == {f"cell{i}" for i in range(4)}
    for cell in covered:  # each cell's segments tile the run without gaps or overlaps
        spans = sorted((s.start_s, s.end_s) for s in first.timeline if s.cell == cell)
        assert spans[0][0] == 0.0 and spans[-1][1] == pytest.approx(first.total_s)
        assert all(a[1] == pytest.approx(b[0]) for a, b in itertools.pairwise(spans))


def test_colocate_never_samples_while_training_and_async_never_switches_after_its_split() -> None:
    colocate = simulate(SMALL, PolicyConfig(mode="colocate"))
    assert colocate.staleness_max == 0 and colocate.switches == 8 * 2 * 4
    assert simulate(SMALL, PolicyConfig(mode="async", async_train_cells=2)).switches == 2


def test_elastic_with_overlap_beats_colocate_and_single_step_bursts_on_long_tails() -> None:
    results = compare(SMALL)
    sp = speedups(results)
    assert sp.over_colocate > 1.5 and sp.over_onestep > 1.3
    # at least on par with the best fixed split in hindsight (figures: BENCHMARKS.md)
    assert sp.over_oracle > 0.95
    assert results["elastic (overlap)"].total_s < results["elastic (single-step bursts)"].total_s


def test_shipped_workloads_load_and_bad_ones_are_refused(tmp_path: Path) -> None:
    assert load_workload("paper").tasks.steps == 48
    assert load_workload("longtail").cluster.capacity == 64
    bad = tmp_path / "bad.toml"
    bad.write_text("[cluster]\ncells = 0\n")
    with pytest.raises(ConfigError, match="cells"):
        load_workload(bad)
    with pytest.raises(ConfigError, match="shipped: agentic, bursty, growing, learning, longtail, moving, paper, short"):  # fmt: skip
        load_workload(tmp_path / "missing.toml")


def test_multi_turn_executions_decode_slower_in_bigger_batches_and_stop_at_the_budget() -> None:
    def turns(growth: float, budget_s: float = 7200.0) -> Workload:
        cluster = msgspec.structs.replace(SMALL.cluster, decode_step_s=0.5, decode_step_growth=growth)
        tasks = msgspec.structs.replace(SMALL.tasks, turns=5, tokens_per_call=200, budget_s=budget_s)
        return Workload(cluster=cluster, tasks=tasks)

    cfg = PolicyConfig(mode="elastic")
    flat, crowded = simulate(turns(0.0), cfg), simulate(turns(0.5), cfg)
    assert len(flat.step_end_s) == len(crowded.step_end_s) == 8
    assert crowded.total_s > flat.total_s * 1.05  # a cell's step slows as its batch grows
    assert flat.total_s > simulate(SMALL, cfg).total_s  # decoding adds to the tools' time
    # cut at the budget: no step waits longer than a budget (plus decoding and training) for its last execution
    cut = simulate(turns(0.0, budget_s=600.0), cfg)
    assert cut.total_s < flat.total_s


def test_gyre_sim_prints_the_comparison_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = tmp_path / "w.toml"
    workload.write_text("[cluster]\ncells = 3\ncapacity = 4\n\n[tasks]\nsteps = 4\nbatch_executions = 8\n")
    assert main(["sim", str(workload), "--plot", str(tmp_path / "roles.png"), "--cells", "2,4"]) == 0
    out = capsys.readouterr().out
    assert "over async with the user's split" in out and "over the hindsight oracle" in out
    assert "one-step off-policy" in out and "lower bound" in out and "per training stint" in out
    assert "Cell count" in out and "│     4 │" in out
    assert (tmp_path / "roles.png").stat().st_size > 10_000


@pytest.mark.parametrize("switch_s", [0.0, 8.52])
def test_cells_switch_a_bounded_number_of_times_per_training_stint_even_when_switches_are_free(
    switch_s: float,
) -> None:
    # a burst's long tail on 16 slots per cell: the water level crosses C_R - C_e again and again while executions
    # wait for capacity (issue 48: before, 29 switches per stint at the published costs; free, it never finished)
    cluster = Cluster(cells=8, capacity=16, micro_step_s=120.0, apply_s=60.0, serve_to_train_s=switch_s,
                      train_to_serve_s=switch_s / 2.5)  # fmt: skip
    tasks = Tasks(steps=8, batch_executions=64, group_size=8, duration_median_s=1800.0, budget_s=14400.0)
    workload = Workload(cluster=cluster, tasks=tasks)
    for overlap in (False, True):
        result = simulate(workload, PolicyConfig(mode="elastic", overlap=overlap))
        assert len(result.step_end_s) == 8
        assert result.stints >= 8 and result.switches_per_stint <= 2.0
    for mode in ("colocate", "async", "onestep"):
        fixed = simulate(workload, PolicyConfig(mode=mode, async_train_cells=3))  # type: ignore[arg-type]
        assert fixed.switches_per_stint <= 2.0

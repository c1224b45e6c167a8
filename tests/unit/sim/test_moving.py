"""Workloads that move (horizons, tails, training cost, tool bursts, lost cells), the baselines a user would run,
carry-over, and the bound no policy can beat."""

from __future__ import annotations

import statistics
from pathlib import Path

import msgspec
import pytest

from gyre.cli import main
from gyre.control import PolicyConfig
from gyre.control.books import Books, replay
from gyre.errors import ConfigError
from gyre.sim import Cluster, Tasks, Trace, Workload, durations, simulate
from gyre.sim.report import best_split, compare, load_workload, lower_bound, user_split
from gyre.sim.simulate import Drift, stretched, training_costs

SMALL = Workload(
    cluster=Cluster(cells=4, capacity=8, micro_step_s=120.0, apply_s=30.0),
    tasks=Tasks(steps=10, batch_executions=16, duration_median_s=900.0, budget_s=7200.0, group_size=4),
)
MODES = [
    PolicyConfig(mode="elastic"),
    PolicyConfig(mode="elastic", overlap=False),
    PolicyConfig(mode="async", async_train_cells=2),
    PolicyConfig(mode="onestep", async_train_cells=2),
    PolicyConfig(mode="colocate"),
]


def moved(**drift: float) -> Workload:
    return msgspec.structs.replace(SMALL, drift=Drift(**drift))  # type: ignore[arg-type]


def test_a_stationary_drift_draws_the_same_executions_and_growth_moves_them_step_by_step() -> None:
    tasks = SMALL.tasks
    assert durations(tasks) == durations(tasks, Drift())
    grown = durations(tasks, Drift(horizon_growth=4.0))
    first, last = grown[: tasks.batch_executions], grown[-tasks.batch_executions :]
    assert statistics.median(last) > 3 * statistics.median(first)
    # the same draws: every execution of the first step is unchanged, later ones scaled up (or cut at the budget)
    assert first == durations(tasks)[: tasks.batch_executions]
    assert all(g >= d for g, d in zip(grown, durations(tasks), strict=True))
    thick = durations(msgspec.structs.replace(tasks, steps=3), Drift(tail_peak=3.0))
    plain = durations(msgspec.structs.replace(tasks, steps=3))
    middle = slice(tasks.batch_executions, 2 * tasks.batch_executions)
    assert max(thick[middle]) > max(plain[middle])  # the tail is heaviest mid-run
    assert thick[: tasks.batch_executions] == plain[: tasks.batch_executions]


def test_a_burst_slows_progress_only_while_it_lasts() -> None:
    drift = Drift(burst_every_s=100.0, burst_for_s=20.0, burst_slowdown=4.0)  # bursts at 50-70, 150-170, ...
    assert stretched(drift, 0.0, 40.0) == 40.0  # ends before the first burst
    assert stretched(drift, 0.0, 55.0) == pytest.approx(50.0 + 5.0 * 4)  # 5 s of work inside the burst
    assert stretched(drift, 55.0, 10.0) == pytest.approx(70.0 + 10.0 - 15.0 / 4)  # 15 s of burst do 3.75 s
    assert stretched(drift, 0.0, 200.0) == pytest.approx(200.0 + 2 * 20.0 * (1 - 1 / 4))  # two whole bursts
    assert stretched(Drift(), 3.0, 7.0) == 10.0


@pytest.mark.parametrize("cfg", MODES, ids=lambda c: f"{c.mode}{'' if c.overlap else '-bursts'}")
def test_every_mode_survives_lost_cells_and_bursts_and_trains_every_step(cfg: PolicyConfig) -> None:
    rough = moved(burst_every_s=3000.0, burst_for_s=900.0, burst_slowdown=3.0, outage_every_s=2000.0,
                  outage_for_s=700.0, outage_cells=2)  # fmt: skip
    result, calm = simulate(rough, cfg), simulate(SMALL, cfg)
    assert len(result.step_end_s) == 10 and result.step_end_s == sorted(result.step_end_s)
    gone = [s for s in result.timeline if s.role == "gone"]
    assert gone and all(s.cell != "cell0" for s in gone)  # satellites are lost, never the core
    assert all(s.end_s - s.start_s == pytest.approx(700.0) for s in gone if s.end_s < result.total_s)
    assert result.total_s > calm.total_s
    assert result.staleness_max <= cfg.max_staleness


def test_a_trainer_lost_mid_micro_step_has_its_data_trained_elsewhere() -> None:
    # training is long, so the lost satellites are caught computing; the run still applies every step
    heavy = msgspec.structs.replace(SMALL, cluster=msgspec.structs.replace(SMALL.cluster, micro_step_s=900.0),
                                    drift=Drift(outage_every_s=1500.0, outage_for_s=600.0, outage_cells=3))  # fmt: skip
    result = simulate(heavy, PolicyConfig(mode="async", async_train_cells=3))
    assert len(result.step_end_s) == 10 and result.requeued > 0
    assert any(s.role == "gone" and s.cell in ("cell1", "cell2") for s in result.timeline)


def test_one_step_off_policy_trains_whole_steps_and_never_beats_async_with_its_split() -> None:
    for k in (1, 2, 3):
        onestep = simulate(SMALL, PolicyConfig(mode="onestep", async_train_cells=k))
        streaming = simulate(SMALL, PolicyConfig(mode="async", async_train_cells=k))
        assert onestep.total_s >= streaming.total_s
        assert onestep.switches == streaming.switches == k and onestep.async_train_cells == k
        assert onestep.staleness_max <= 1


def test_the_users_split_comes_from_the_first_tenth_of_the_run_and_can_miss_the_oracles() -> None:
    # horizons grow 6x while training stays as it was: a split fit on the first steps trains too much by the end
    growing = msgspec.structs.replace(
        SMALL, tasks=msgspec.structs.replace(SMALL.tasks, steps=20), drift=Drift(horizon_growth=6.0)
    )  # fmt: skip
    assert user_split(growing) == best_split(growing, until_step=2)[0] == 2
    results = compare(growing)
    oracle = results["async (hindsight oracle split)"]
    assert oracle.total_s == min(
        simulate(growing, PolicyConfig(mode="async", async_train_cells=k)).total_s for k in (1, 2, 3)
    )
    assert oracle.async_train_cells == 1  # the whole run wanted one trainer
    assert results["async (split from the first 10%)"].total_s > oracle.total_s


@pytest.mark.parametrize("name", ["paper", "growing", "bursty", "moving", "short", "learning"])
def test_no_mode_beats_the_lower_bound(name: str) -> None:
    workload = load_workload(name)
    small = msgspec.structs.replace(workload, tasks=msgspec.structs.replace(workload.tasks, steps=12))
    for staleness in (1, 2):
        bound = lower_bound(small, staleness)
        carried = lower_bound(small, staleness, carry_over=True)
        assert carried.total_s <= bound.total_s
        for mode, k in (("elastic", 0), ("async", 2), ("onestep", 3), ("colocate", 0)):
            cfg = PolicyConfig(mode=mode, max_staleness=staleness, async_train_cells=max(k, 1))  # type: ignore[arg-type]
            assert simulate(small, cfg).total_s >= bound.total_s * 0.999, (mode, staleness)
            carry = msgspec.structs.replace(cfg, carry_over=True)
            assert simulate(small, carry).total_s >= carried.total_s * 0.999, (mode, staleness, "carry")


def test_carry_over_closes_steps_without_their_slowest_executions_and_trains_each_group_once() -> None:
    tasks = msgspec.structs.replace(SMALL.tasks, duration_p99_over_p50=20.0)
    tail = msgspec.structs.replace(SMALL, tasks=tasks)
    plain = simulate(tail, PolicyConfig(mode="elastic"))
    carry = simulate(tail, PolicyConfig(mode="elastic", carry_over=True))
    assert carry.total_s < plain.total_s * 0.95
    assert carry.carried > 0 and plain.carried == 0
    assert plain.staleness_max <= 1 < carry.staleness_max  # the carried began on older weights...
    assert carry.token_lag_mean < carry.staleness_mean + 0.5  # ...but most of their tokens sampled newer ones


def test_books_land_whole_groups_in_the_first_step_not_full_and_replay() -> None:
    books = Books(batch_executions=4, burst_steps=1, steps=3)
    books.dispatch(8)
    for i in (4, 5, 6, 7):  # the second step's executions finish first
        books.finish(i, ready=False)
    assert books.land(4, 2) == 0 and books.land(6, 2) == 0 and books.landing == 1
    assert books.ready.get(0, 0) == 0  # ready once the caller knows there is something to compute
    books.make_ready(0, 4)
    with pytest.raises(ValueError, match="groups must divide"):
        Books(batch_executions=4, burst_steps=1, steps=3).land(0, 5)
    books.take(4)
    assert books.applied() == [0, 0, 0, 0] and books.members[0] == [4, 5, 6, 7]
    again = Books(batch_executions=4, burst_steps=1, steps=3)
    replay(again, books.events)
    assert (again.members, again.landing, again.version) == (books.members, books.landing, books.version)


def test_gyre_sim_on_a_moving_workload_prints_seeds_and_writes_the_map(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = tmp_path / "w.toml"
    workload.write_text("[cluster]\ncells = 3\ncapacity = 4\n\n[tasks]\nsteps = 4\nbatch_executions = 8\n\n"
                        "[drift]\nhorizon_growth = 2.0\n")  # fmt: skip
    assert main(["sim", str(workload), "--seeds", "2", "--map", str(tmp_path / "map.png")]) == 0
    out = capsys.readouterr().out
    assert "moving" in out and "on 2 seeds" in out
    assert (tmp_path / "map.png").stat().st_size > 10_000


def test_a_recorded_trace_is_replayed_as_given_and_a_wrong_one_is_refused(tmp_path: Path) -> None:
    cluster = Cluster(
        cells=2, capacity=4, micro_step_s=1.0, apply_s=1.0, serve_to_train_s=0.0, train_to_serve_s=0.0
    )
    tasks = Tasks(steps=2, batch_executions=4, group_size=2, budget_s=1e6)
    traced = Workload(cluster=cluster, tasks=tasks,
                      trace=Trace(durations_s=[10.0, 20.0, 30.0, 400.0, 5.0, 5.0, 5.0, 5.0],
                                  micro_steps_s=[2.0] * 8))  # fmt: skip
    result = simulate(traced, PolicyConfig(mode="colocate"))
    # step 0 waits for its 400 s execution, then 4 micro-steps of 2 s on 2 cells and the update
    assert result.step_end_s[0] == pytest.approx(400.0 + 2 * 2.0 + 1.0)
    carried = simulate(traced, PolicyConfig(mode="async", async_train_cells=1, carry_over=True))
    # the 400 s execution's group (2 executions) lands in step 1; step 0 closes on step 1's quick ones
    assert carried.step_end_s[0] < 100.0 and carried.carried == 2
    bad = tmp_path / "bad.toml"
    bad.write_text("[tasks]\nsteps = 2\nbatch_executions = 4\n\n[trace]\ndurations_s = [1.0, 2.0]\n")
    with pytest.raises(ConfigError, match="the trace has 2 durations; the workload runs 8 executions"):
        load_workload(bad)


def test_groups_that_scored_alike_cost_no_training_and_a_split_fit_on_a_cold_start_is_short() -> None:
    """Binary rewards, zero-advantage groups not computed: a cold start trains little, so the split a user fits on
    the first steps is short of trainers once the policy solves half its tasks; elastic follows the work."""
    failing = moved(solve_rate_start=0.0, solve_rate_end=0.0)
    costs = training_costs(failing, durations(failing.tasks))
    assert set(costs) == {0.0}  # every group failed whole: nothing to compute
    nothing = simulate(failing, PolicyConfig(mode="elastic"))
    assert len(nothing.step_end_s) == 10 and nothing.switches == 0  # no trainer was ever called
    learning = Workload(
        cluster=Cluster(cells=4, capacity=8, micro_step_s=300.0, apply_s=30.0),
        tasks=Tasks(steps=20, batch_executions=32, duration_median_s=900.0, budget_s=7200.0, group_size=4),
        drift=Drift(solve_rate_start=0.0, solve_rate_end=0.5),
    )
    costs = training_costs(learning, durations(learning.tasks))
    batch = learning.tasks.batch_executions
    assert sum(costs[:batch]) == 0 and sum(costs[-batch:]) > 0  # no signal at first, plenty by the end
    results = compare(learning)
    user, oracle = results["async (split from the first 10%)"], results["async (hindsight oracle split)"]
    assert user.async_train_cells < oracle.async_train_cells and user.total_s > oracle.total_s
    assert results["elastic (overlap)"].total_s * 1.5 < user.total_s  # (1.75x on this shape)
    with pytest.raises(msgspec.ValidationError, match="solve_rate_end"):
        msgspec.convert({"solve_rate_start": 0.1}, Drift)

"""The scheduling policy: the water-level rule, serial moves in order, the way back, and the two baselines."""

from __future__ import annotations

import itertools

from gyre.control import CellView, Dispatch, Observation, PolicyConfig, ToServe, ToTrain, decide

ELASTIC = PolicyConfig(mode="elastic", overlap=False)


def cells(*roles: str, capacity: int = 8) -> tuple[CellView, ...]:
    return tuple(CellView(name=f"c{i}", role=r, capacity=capacity) for i, r in enumerate(roles))  # type: ignore[arg-type]


def obs(roles: tuple[CellView, ...], **kw: object) -> Observation:
    base: dict[str, object] = dict(in_flight=0, undispatched=0, undispatched_step=0, next_burst=0, data_ready=False,
                                   step_running=False, version=0, next_burst_step=1)  # fmt: skip
    return Observation(cells=roles, **(base | kw))  # type: ignore[arg-type]


def test_the_core_leaves_first_and_only_when_the_water_level_leaves_room_without_it() -> None:
    four = cells("serving", "serving", "serving", "serving")  # C_R = 32, C_e = 8
    assert decide(ELASTIC, obs(four, in_flight=25, data_ready=True)) == []  # 25 > 32 - 8
    assert decide(ELASTIC, obs(four, in_flight=24, data_ready=True)) == [ToTrain("c0")]
    assert decide(ELASTIC, obs(four, in_flight=4, data_ready=False)) == []  # nothing to train yet


def test_satellites_follow_in_order_one_switch_at_a_time() -> None:
    assert decide(ELASTIC, obs(cells("training", "serving", "serving"), in_flight=7, data_ready=True)) == [
        ToTrain("c1")
    ]
    assert decide(ELASTIC, obs(cells("training", "serving", "serving"), in_flight=9, data_ready=True)) == []
    assert decide(ELASTIC, obs(cells("draining", "serving", "serving"), in_flight=0, data_ready=True)) == []


def test_no_trainer_is_called_back_for_executions_the_staleness_bound_holds_back() -> None:
    # mid-step, 8 executions in flight on the one serving cell, 8 more of step 2 not dispatched: at version 0 they
    # may not start (2 - 0 > max_staleness 1), so serving is not short and the satellite keeps training (calling it
    # back made elastic 0.84x the user's async on training-heavy, heavy-tailed workloads: BENCHMARKS.md)
    mid = cells("training", "training", "serving")
    held = obs(
        mid, in_flight=8, undispatched=8, undispatched_step=2, version=0, data_ready=True, step_running=True
    )
    assert decide(ELASTIC, held) == []
    # once the update makes them admissible, serving is short and the last satellite returns
    admitted = obs(mid, in_flight=8, undispatched=8, undispatched_step=2, version=1, data_ready=True,
                   step_running=True)  # fmt: skip
    assert decide(ELASTIC, admitted) == [ToServe("c1")]


def test_after_the_step_satellites_go_back_first_and_the_core_only_when_nothing_is_left_to_train() -> None:
    done = cells("training", "training", "training", "serving")
    assert decide(ELASTIC, obs(done, in_flight=2, data_ready=False)) == [ToServe("c2")]
    assert decide(ELASTIC, obs(cells("training", "serving", "serving", "serving"), data_ready=False)) == [
        ToServe("c0")
    ]
    # the next step's data is ready and capacity suffices: the training cells stay
    assert decide(ELASTIC, obs(done, in_flight=2, data_ready=True, step_running=True)) == []
    # capacity short: a satellite returns even mid-step; the core does not
    assert decide(ELASTIC, obs(done, in_flight=9, data_ready=True, step_running=True)) == [ToServe("c2")]
    assert (
        decide(ELASTIC, obs(cells("training", "serving"), in_flight=9, data_ready=True, step_running=True))
        == []
    )


def test_dispatch_fills_serving_capacity_and_overlap_respects_staleness() -> None:
    two = cells("serving", "serving")
    assert decide(ELASTIC, obs(two, in_flight=10, undispatched=20)) == [Dispatch(6)]
    overlap = PolicyConfig(mode="elastic", overlap=True, max_staleness=1)
    assert decide(overlap, obs(two, in_flight=10, undispatched=2, next_burst=50)) == [Dispatch(2, 4)]
    stale = obs(two, in_flight=10, undispatched=0, next_burst=50, version=0, next_burst_step=2)
    assert decide(overlap, stale) == []  # they would train 2 versions after the weights that sample them
    assert decide(ELASTIC, obs(two, in_flight=10, next_burst=50)) == []  # single-step bursts: no overlap
    # the current burst is gated too: its executions would train 2 versions after the weights sampling them
    assert decide(ELASTIC, obs(two, in_flight=10, undispatched=20, undispatched_step=3, version=1)) == []


def test_standalone_servers_never_train_and_count_as_serving_capacity() -> None:
    mixed = (*cells("serving"), CellView(name="s", role="serving", capacity=8, standalone=True))
    assert decide(ELASTIC, obs(mixed, in_flight=8, data_ready=True)) == [ToTrain("c0")]
    assert decide(ELASTIC, obs((mixed[1],), in_flight=0, data_ready=True)) == []


def test_colocate_samples_the_whole_burst_then_trains_with_every_cell() -> None:
    cfg = PolicyConfig(mode="colocate")
    three = cells("serving", "serving", "serving")
    assert decide(cfg, obs(three, in_flight=3, data_ready=True)) == []  # the burst is not done
    assert decide(cfg, obs(three, in_flight=0, data_ready=True)) == [
        ToTrain("c0"),
        ToTrain("c1"),
        ToTrain("c2"),
    ]
    training = cells("training", "training", "training")
    assert decide(cfg, obs(training, step_running=True, undispatched=24)) == []  # no sampling while training
    assert decide(cfg, obs(training, undispatched=24)) == [ToServe("c0"), ToServe("c1"), ToServe("c2")]


def test_async_keeps_a_fixed_split_and_samples_ahead_by_at_most_max_staleness() -> None:
    cfg = PolicyConfig(mode="async", async_train_cells=1, max_staleness=1)
    assert decide(cfg, obs(cells("serving", "serving"), undispatched=4)) == [ToTrain("c0"), Dispatch(4)]
    split = cells("training", "serving")
    assert decide(cfg, obs(split, in_flight=8, data_ready=False)) == []
    assert decide(cfg, obs(split, in_flight=4, next_burst=8, version=3, next_burst_step=4)) == [
        Dispatch(0, 4)
    ]
    assert decide(cfg, obs(split, in_flight=4, next_burst=8, version=3, next_burst_step=5)) == []


def test_executions_waiting_for_capacity_count_at_the_move_to_training_boundary() -> None:
    four = cells("serving", "serving", "serving", "serving")  # C_R = 32, C_e = 8
    # 20 in flight and 4 waiting fill the 24 slots left without the core: it leaves, and the 4 start
    assert decide(ELASTIC, obs(four, in_flight=20, undispatched=4, data_ready=True)) == [
        ToTrain("c0"),
        Dispatch(4),
    ]
    # one more waiting and the 24 slots would not hold them: the core stays and serves all 5
    assert decide(ELASTIC, obs(four, in_flight=20, undispatched=5, data_ready=True)) == [Dispatch(5)]
    # the next burst's executions wait too when overlap may start them
    overlap = PolicyConfig(mode="elastic", overlap=True, max_staleness=1)
    assert decide(overlap, obs(four, in_flight=20, next_burst=5, data_ready=True)) == [Dispatch(0, 5)]
    # executions the staleness bound holds back do not wait for capacity: the core leaves
    held = obs(four, in_flight=20, undispatched=5, undispatched_step=2, version=0, data_ready=True)
    assert decide(ELASTIC, held) == [ToTrain("c0")]


def test_a_move_to_training_stands_until_the_demand_grows_past_the_serving_capacity() -> None:
    # every demand around the boundary, mid-step: a satellite that leaves is not sent back by the same demand once it
    # trains (the executions dispatched with the move included); one execution more than C_R sends it back
    overlap = PolicyConfig(mode="elastic", overlap=True, max_staleness=1)
    moved = 0
    for cfg in (ELASTIC, overlap):
        for in_flight, undispatched, next_burst in itertools.product(range(0, 25, 2), range(9), range(9)):
            seen = dict(in_flight=in_flight, undispatched=undispatched, next_burst=next_burst, data_ready=True,
                        step_running=True)  # fmt: skip
            actions = decide(cfg, obs(cells("training", "serving", "serving", "serving"), **seen))
            if ToTrain("c1") not in actions:
                continue
            moved += 1
            started = next((a for a in actions if isinstance(a, Dispatch)), Dispatch(0))
            after = dict(
                seen,
                in_flight=in_flight + started.current + started.next,
                undispatched=undispatched - started.current,
                next_burst=next_burst - started.next,
            )
            trains = cells("training", "training", "serving", "serving")
            returned = [a for a in decide(cfg, obs(trains, **after)) if isinstance(a, ToServe)]
            assert returned == [], (cfg.overlap, seen)
            grown = dict(after, undispatched=17 - after["in_flight"], next_burst=0)  # type: ignore[operator]
            assert decide(cfg, obs(trains, **grown))[0] == ToServe("c1")
    assert moved > 20

"""The live loop drives real cells with the same policy and books as the simulator, in each mode: every step is
applied, no execution fails, and replaying the run's events through fresh books gives every decision it took."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
import torch
from live import Live
from safetensors.torch import load_file

from gyre.config import TrajectoryConfig
from gyre.control.books import Books, replay
from gyre.control.loop import ElasticLoop, LoopResult, group_micro_steps
from gyre.control.policy import PolicyConfig, ToServe, ToTrain, decide
from gyre.sim.simulate import Books as SimBooks
from gyre.sim.simulate import decide as sim_decide
from gyre.train.step import Rollout

pytestmark = pytest.mark.slow(reason="runs the driver loop's steps in each mode on a live cluster")
STEPS, BATCH, GROUP = 3, 4, 2


def test_each_mode_runs_its_steps_and_replays(tiny_model: Path, tmp_path: Path) -> None:
    overrides = ["cells.count=2", "cells.capacity_executions=2"]
    modes = {
        "elastic": PolicyConfig(mode="elastic", overlap=True, max_staleness=1),
        "colocate": PolicyConfig(mode="colocate"),
        "async": PolicyConfig(mode="async", async_train_cells=1, max_staleness=1),
        "onestep": PolicyConfig(mode="onestep", async_train_cells=1, max_staleness=1),
    }

    async def main() -> dict[str, LoopResult]:
        results = {}
        async with Live(tiny_model, tmp_path, overrides) as live:
            for mode, policy in modes.items():
                for cell in live.controller.cell_views():  # each mode starts with every cell serving
                    if cell.role == "training":
                        await live.controller.to_serve(cell.name)
                loop = ElasticLoop(
                    live.controller, policy, Books(BATCH, 1, STEPS), GROUP,
                    lambda i: live.execution(i, GROUP, tool_s=0.4 * (i % 4)),  # groups finish apart
                    group_micro_steps(TrajectoryConfig(), BATCH),
                )  # fmt: skip
                results[mode] = await loop.run()
        return results

    results = asyncio.run(main())
    for mode, result in results.items():
        policy = modes[mode]
        assert len(result.steps) == STEPS and result.failed_executions == 0, mode
        assert all(m.micro_steps > 0 for m in result.steps), mode
        assert not any(s.error for s in result.switches), mode
        moves = [a for d in result.decisions for a in d.actions if isinstance(a, ToTrain | ToServe)]
        assert len(moves) == len(result.switches), mode
        if mode in (
            "async",
            "onestep",
        ):  # a fixed split: the core trains, the other cell serves, start to end
            assert [(type(a).__name__, a.cell) for a in moves] == [("ToTrain", "cell-0")]
        else:
            assert {a.cell for a in moves if isinstance(a, ToTrain)} >= {"cell-0"}
        # the simulator's books and policy, fed the live run's events, take every decision the live loop took
        assert SimBooks is Books and sim_decide is decide
        books, seen = Books(BATCH, 1, STEPS), 0
        for d in result.decisions:
            replay(books, result.events[seen : d.events])
            seen = d.events
            observation = books.observation(d.cells, d.pending, policy.max_staleness)
            assert decide(policy, observation) == d.actions, mode
            if mode == "colocate" and any(isinstance(a, ToTrain) for a in d.actions):
                assert observation.in_flight == 0  # the barrier: nothing is sampled while cells train
        assert msgspec.json.decode(msgspec.json.encode(result), type=LoopResult) == result
        finished: set[int] = set()
        for what, a, _ in result.events:
            finished |= {a} if what == "finish" else set()
            if what == "ready" and mode == "onestep":  # one-step off-policy: a step trains once sampled whole
                assert set(range(a * BATCH, (a + 1) * BATCH)) <= finished, result.events


def test_a_step_whose_every_execution_was_dropped_trains_nothing_and_the_run_goes_on(
    tiny_model: Path, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "checkpoints"
    overrides = [
        "cells.count=1",
        "trainer.checkpoint_every_steps=1",
        f'trainer.checkpoint_dir="{checkpoints}"',
    ]

    async def main() -> LoopResult:
        async with Live(tiny_model, tmp_path, overrides) as live:

            async def execute(i: int) -> Rollout:
                if i >= 2 * BATCH:  # step 2: every group scored alike (all passed)
                    return msgspec.structs.replace(await live.execution(i, GROUP), reward=1.0)
                if i >= BATCH:  # step 1 runs as usual
                    return await live.execution(i, GROUP)
                if i % 2:
                    raise RuntimeError("sandbox quota exceeded")
                return Rollout(execution_id=f"x{i}", group=f"g{i // GROUP}", reward=0.0, records=[], dropped=True,
                               why="verifier failed to start: bwrap: No permissions")  # fmt: skip

            loop = ElasticLoop(live.controller, PolicyConfig(mode="colocate"), Books(BATCH, 1, 3), GROUP, execute,
                               group_micro_steps(TrajectoryConfig(), BATCH))  # fmt: skip
            return await loop.run()

    result = asyncio.run(main())
    empty, trained, alike = result.steps
    assert (empty.micro_steps, empty.version, trained.version) == (0, 1, 2)
    # nothing to learn from groups that scored alike: not computed, no trainer called, the weights left alone
    assert (alike.micro_steps, alike.version) == (0, 3)
    assert alike.untrained == "every group scored alike (advantage 0: nothing to learn, nothing computed)"
    # colocate moves its cell to training and back for a step with work: step 1 only
    assert [s.direction for s in result.switches] == ["serve_to_train", "train_to_serve"], result.switches
    assert empty.untrained == (
        "4 of 4 executions dropped (2x crashed: sandbox quota exceeded; "
        "2x verifier failed to start: bwrap: No permissions)"
    )
    assert trained.micro_steps > 0 and trained.untrained == ""
    assert result.failed_executions == 2
    initial, kept = (load_file(str(d / "model.safetensors")) for d in (tiny_model, checkpoints / "step-1"))
    assert all(torch.equal(initial[k], kept[k]) for k in kept)  # the empty step left the weights alone
    before, after = (load_file(str(checkpoints / f"step-{n}" / "model.safetensors")) for n in (2, 3))
    assert all(torch.equal(before[k], after[k]) for k in after)


def test_with_carry_over_a_step_trains_the_groups_that_finished_and_the_slow_one_lands_later(
    tiny_model: Path, tmp_path: Path
) -> None:
    # execution 1 (group 0, dispatched for step 0) runs long: step 0 closes without it, on the next groups to finish
    trained: dict[int, list[str]] = {}

    async def main() -> LoopResult:
        async with Live(tiny_model, tmp_path, ["cells.count=2", "cells.capacity_executions=4"]) as live:
            policy = PolicyConfig(mode="async", async_train_cells=1, max_staleness=1, carry_over=True)
            loop = ElasticLoop(
                live.controller, policy, Books(BATCH, 1, STEPS), GROUP,
                lambda i: live.execution(i, GROUP, tool_s=4.0 if i == 1 else 0.1),
                group_micro_steps(TrajectoryConfig(), BATCH),
                on_step=lambda step, _, rollouts: trained.setdefault(step, [r.execution_id for r in rollouts]),
            )  # fmt: skip
            return await loop.run()

    result = asyncio.run(main())
    assert len(result.steps) == STEPS and result.failed_executions == 0
    assert all(m.micro_steps > 0 for m in result.steps)
    everyone = [x for step in range(STEPS) for x in trained[step]]
    assert sorted(everyone) == sorted(f"x{i}" for i in range(STEPS * BATCH))  # each trained once
    assert all(len(trained[step]) == BATCH for step in range(STEPS))
    late = next(step for step, ids in trained.items() if "x1" in ids)
    assert late > 0 and {"x0", "x1"} <= set(trained[late])  # the slow one's whole group, in a later step
    assert set(trained[0]) & {f"x{i}" for i in range(BATCH, 2 * BATCH)}  # step 0 took groups of step 1
    landed = [(a, b) for what, a, b in result.events if what == "land"]
    assert sorted(first for first, _ in landed) == list(range(0, STEPS * BATCH, GROUP))
    books = Books(BATCH, 1, STEPS)
    replay(books, result.events)  # the simulator's books account for the run the same way
    assert books.done
    assert {s: sorted(m) for s, m in books.members.items()} == {
        s: sorted(int(x[1:]) for x in trained[s]) for s in range(STEPS)
    }

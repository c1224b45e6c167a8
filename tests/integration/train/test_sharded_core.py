"""A core cell of 2 and 4 ranks (``trainer.ranks``, ZeRO-1 over gloo) with satellites joining late, one killed before
it sends its sum: every update equals one process computing the whole batch, each rank holds 1/N of the optimizer
state and gradient sum, and a checkpoint saved by 4 ranks resumes on 2 with the same next update."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_elastic import Cluster, assert_accounted, assert_same_update, reference, wait_for

from gyre.train.state import TrainState
from reference import random_micro_steps, train_step

SLOW = pytest.mark.slow(reason="a core cell of several rank processes with satellites")


def sharded(model: Path, tmp: Path, shards: int, core_computes: bool = True, timeout_s: float = 30.0,
            resume: Path | None = None, extra: tuple[str, ...] = ()) -> Cluster:  # fmt: skip
    # small buckets: a 1.7 M model crosses several on every transfer, as a big model crosses 512 MiB ones
    return Cluster(model, tmp, core_computes, timeout_s, resume,
                   extra=(f"trainer.ranks={shards}", "trainer.bucket_mib=0.5", *extra))  # fmt: skip


def assert_state_split(shards: list[dict[str, int]], world: int, numel: int) -> None:
    """Each rank's master, gradient-sum and AdamW bytes are 1/N of one process's (within 5%), covering the model."""
    assert len(shards) == world and [s["rank"] for s in shards] == list(range(world))
    assert sum(s["end"] - s["start"] for s in shards) == numel
    for s in shards:
        assert s["gradient_bytes"] <= 8 * numel / world * 1.05  # float64 sum
        assert s["master_bytes"] <= 4 * numel / world * 1.05
        assert 0 < s["optimizer_bytes"] <= (2 * 4 * numel / world + 4) * 1.05  # two fp32 moments and a step


@SLOW  # 35 s at 2 shards; the fast tier steps a sharded cell in test_micro_steps_longer_than_a_rank_takes...
@pytest.mark.parametrize("shards", [2, 4])
def test_a_sharded_core_with_late_satellites_gives_the_update_of_one_process(
    tiny_model: Path, tmp_path: Path, shards: int
) -> None:
    first, second = random_micro_steps(201, 14), random_micro_steps(202, 10)
    with sharded(tiny_model, tmp_path, shards) as c:
        c.client.submit(0, first[:6])  # the step is under way before the satellite joins
        c.start("sat")
        wait_for("the satellite", lambda: len(c.stats().members) == 1)
        c.client.submit(0, first[6:], seal=True)
        metrics = c.client.wait_step(0, timeout_s=300)
        assert_accounted(metrics, first)
        c.client.submit(1, second, seal=True)
        assert_accounted(c.client.wait_step(1, timeout_s=300), second)
        stats = c.stats()
        got = c.weights_after(tmp_path / "ckpt")
    want = reference(tiny_model, first)
    train_step(want, second)
    assert_same_update(got, want)
    assert_state_split(stats.ranks, shards, want.numel)


@SLOW
def test_a_satellite_killed_before_its_sum_reaches_every_rank_loses_only_its_micro_steps(
    tiny_model: Path, tmp_path: Path
) -> None:
    items = random_micro_steps(211, 12)
    # 20 s: the timeout is also the healthy "a" and "b"'s, started afterwards to compute the step
    with sharded(tiny_model, tmp_path, 2, core_computes=False, timeout_s=20.0) as c:
        victim = c.start("victim")
        wait_for("the victim", lambda: len(c.stats().members) == 1)
        c.client.submit(0, items[:5])  # not sealed: it computes all five and holds their sum
        wait_for("the victim to hold five micro-steps", lambda: len(c.stats().held.get("victim", [])) == 5)
        victim.kill()
        # the only member: with no member heard, its silence is judged against ALL_QUIET timeouts (60 s)
        wait_for("the victim to be declared gone", lambda: c.stats().members["victim"] == "gone", 180)
        assert c.stats().pending == 5 and c.stats().gradient_bytes_in == 0
        c.start("a")
        c.start("b")  # a second satellite joins mid-step
        c.client.submit(0, items[5:], seal=True)
        metrics = c.client.wait_step(0, timeout_s=300)
        got = c.weights_after(tmp_path / "ckpt")
    assert metrics.reclaimed == 5 and set(metrics.by_member) <= {"a", "b"}
    assert_accounted(metrics, items)
    assert_same_update(got, reference(tiny_model, items))


@SLOW
def test_a_checkpoint_saved_by_four_ranks_resumes_on_two_with_the_same_next_update(
    tiny_model: Path, tmp_path: Path
) -> None:
    first, second = random_micro_steps(221, 8), random_micro_steps(222, 8)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    with sharded(tiny_model, tmp_path / "a", 4) as c:
        c.client.submit(0, first, seal=True)
        c.client.wait_step(0, timeout_s=300)
        saved = c.client.save_checkpoint(tmp_path / "after-step-0")
        c.client.submit(1, second, seal=True)
        c.client.wait_step(1, timeout_s=300)
        straight = c.weights_after(tmp_path / "straight")
    assert len(list((saved / "optimizer").glob("*.distcp"))) == 4  # one file per rank
    resumed = sharded(tiny_model, tmp_path / "b", 2, resume=saved)
    try:
        assert resumed.stats().step == 1
        resumed.client.submit(1, second, seal=True)
        assert resumed.client.wait_step(1, timeout_s=300).version == 2
        again = resumed.weights_after(tmp_path / "resumed")
    finally:
        resumed.close()
    worst = max(float((straight[0][n] - again[0][n]).abs().max()) for n in straight[0])
    worst = max([worst, *(float((straight[1][k] - again[1][k]).abs().max()) for k in straight[1])])
    assert worst <= 1e-6, worst  # the float64 sums are added in another grouping on 2 ranks than on 4


def test_micro_steps_longer_than_a_rank_takes_are_computed_by_the_cell_together_and_the_update_is_exact(
    tiny_model: Path, tmp_path: Path
) -> None:
    items = random_micro_steps(231, 12)  # 20-120 tokens each: about half are past the limit
    with sharded(tiny_model, tmp_path, 2, extra=("trainer.max_tokens_per_rank=64",)) as c:
        c.start("sat")
        c.client.submit(0, items, seal=True)
        metrics = c.client.wait_step(0, timeout_s=300)
        together = c.stats().context_micro_steps
        got = c.weights_after(tmp_path / "ckpt")
    assert_accounted(metrics, items)
    # every long one by the cell together, none by the satellite (one rank: it cannot split one)
    assert together == sum(len(m.input_ids) > 64 for m in items) >= 1
    assert_same_gradient(got, reference(tiny_model, items))


def assert_same_gradient(
    got: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]], want: TrainState
) -> None:
    """A micro-step split over ranks sums its attention in another order than one process: its gradient equals
    within 1e-5 of the largest (AdamW's first moment is 0.1 x the gradient), not bit for bit, so a weight whose
    gradient is near 0 may take AdamW's first sign-sized step the other way; every other weight matches within 1e-6."""
    weights, moments = got
    scale = max(float(want.optimizer.state[p]["exp_avg"].abs().max()) for _, p in want.named)
    for i, (name, p) in enumerate(want.named):
        m = want.optimizer.state[p]["exp_avg"]
        assert float((moments[f"{i}.exp_avg"] - m).abs().max()) <= 1e-5 * scale, name
        clear = m.abs() > 1e-4 * scale  # a gradient well away from 0: the step's sign cannot flip
        moved = (weights[name] - p.detach())[clear]
        assert moved.numel() == 0 or float(moved.abs().max()) <= 1e-6, name

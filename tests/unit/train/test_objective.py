"""The losses: clipping with asymmetric bounds, truncated importance weights, KL, demonstrations kept apart."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from gyre.config import LossConfig
from gyre.journal.records import CallRecord, CallTiming
from gyre.protocol import MicroStep
from gyre.train import Rollout, build_step, group_advantages
from gyre.train.objective import policy_loss, supervised_loss

TIMING = CallTiming(submitted_s=0.0, first_token_s=None, finished_s=0.0)


def micro(behaviour: list[float], advantages: list[float], objective: str = "policy") -> MicroStep:
    n = len(behaviour)
    return MicroStep(input_ids=list(range(n)), position_ids=list(range(n)), parents=[-1, *range(n - 1)],
                     weights=[1.0 / n] * n, advantages=advantages, behaviour_logprobs=behaviour, versions=[0] * n,
                     sequences=1, objective=objective)  # type: ignore[arg-type]  # fmt: skip


def gradient(m: MicroStep, logprobs: list[float], cfg: LossConfig) -> list[float]:
    lp = torch.tensor(logprobs, requires_grad=True)
    policy_loss(lp, m, cfg).backward()
    assert lp.grad is not None
    return lp.grad.tolist()


def test_ratio_outside_the_asymmetric_bounds_stops_the_gradient_in_the_direction_that_gains() -> None:
    cfg = LossConfig(clip_low=0.2, clip_high=0.28, tis_cap=0.0)
    # ratios 1.25 (inside 1 + 0.28), 1.35 (above), 0.75 (below 1 - 0.2), all with a positive advantage
    m = micro([0.0, 0.0, 0.0], [1.0, 1.0, 1.0])
    g = gradient(m, [math.log(1.25), math.log(1.35), math.log(0.75)], cfg)
    assert g[0] == pytest.approx(-1.25 / 3)  # d/dl of -(r A w)
    assert g[1] == 0.0  # clipped above: no push further up
    assert g[2] == pytest.approx(-0.75 / 3)  # below the bound a positive advantage still pulls it up
    # negative advantages: clipped below, not above
    m = micro([0.0, 0.0], [-1.0, -1.0])
    g = gradient(m, [math.log(0.7), math.log(1.5)], cfg)
    assert g[0] == 0.0
    assert g[1] == pytest.approx(1.5 / 2)


def test_truncated_importance_sampling_caps_how_much_one_token_weighs() -> None:
    m = micro([0.0, 0.0], [-1.0, -1.0])
    uncapped = gradient(m, [math.log(10.0), 0.0], LossConfig(tis_cap=0.0))
    capped = gradient(m, [math.log(10.0), 0.0], LossConfig(tis_cap=2.0))
    assert uncapped[0] == pytest.approx(10.0 / 2)  # a stale or mismatched token dominates without the cap
    assert capped[0] == pytest.approx(2.0 / 2)  # ... and weighs at most tis_cap with it, same direction
    assert capped[1] == uncapped[1] == pytest.approx(1.0 / 2)


def test_policy_loss_refuses_demonstrations_and_supervised_loss_takes_them() -> None:
    demo = micro([-0.25, -0.25], [0.0, 0.0], objective="supervised")
    lp = torch.tensor([-1.0, -3.0], requires_grad=True)
    with pytest.raises(ValueError, match="not sampled by the policy"):
        policy_loss(lp, demo)
    loss = supervised_loss(lp, demo)
    assert float(loss.detach()) == pytest.approx(2.0)  # mean NLL with weights 1/2
    with pytest.raises(ValueError, match="supervised micro-steps"):
        supervised_loss(lp, micro([0.0, 0.0], [1.0, 1.0]))


def _record(source: str) -> CallRecord:
    return CallRecord(call_id=f"{source}-1", session="s", role="main", new_input_ids=[1, 2, 3], output_ids=[4, 5],
                      output_logprobs=[-0.25, -0.25], finish_reason="stop", weight_version=0, cell="c",
                      timing=TIMING, source=source)  # type: ignore[arg-type]  # fmt: skip


def test_build_step_refuses_scripted_records_for_the_policy_gradient_and_trains_them_supervised() -> None:
    rollouts = [Rollout(execution_id="e", group="t", reward=1.0, records=[_record("scripted")])]
    with pytest.raises(ValueError, match="scripted record, not sampled by the policy"):
        build_step(rollouts)
    step = build_step(rollouts, objective="supervised")
    assert [m.objective for m in step.micro_steps] == ["supervised"]
    assert step.trainable_tokens == 2
    assert build_step(
        [Rollout(execution_id="e", group="t", reward=1.0, records=[_record("policy")])]
    ).micro_steps


def test_a_micro_steps_figures_count_trained_tokens_staleness_and_clipping(tiny_model: Path) -> None:
    from gyre.train.objective import compute_gradients
    from gyre.train.state import load_model

    model = load_model(tiny_model)
    m = MicroStep(input_ids=[5, 6, 7, 8], position_ids=[0, 1, 2, 3], parents=[-1, 0, 1, 2],
                  weights=[0.0, 0.0, 0.5, 0.5], advantages=[1.0] * 4, behaviour_logprobs=[0.0, 0.0, -50.0, -5.5],
                  versions=[-1, -1, 1, 3], sequences=1)  # fmt: skip
    stats = compute_gradients(model, m, LossConfig(tis_cap=2.0), policy_version=4)
    assert (stats.tokens, stats.policy_tokens, stats.computed_tokens) == (2, 2, 4)
    assert (stats.staleness_sum, stats.staleness_max) == (3 + 1, 3)
    assert stats.truncated == 1  # exp(-5.x + 50) is far above the cap
    assert stats.clipped >= 1 and stats.ratio_max > 2.0 and stats.entropy_sum > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def _group(task: str, rewards: list[float]) -> list[Rollout]:
    """One task's executions: each samples its own tokens (10 + j, ...) after a shared prompt."""
    out = []
    for j, reward in enumerate(rewards):
        ids = [10 + j + 7 * len(task), 40 + j, 60 + j]
        rec = CallRecord(call_id=f"{task}{j}", session=f"{task}{j}", role="main", parent_call_id=None,
                         prefix_len=0, new_input_ids=[5, 6, 7], output_ids=ids,
                         output_logprobs=[-1.5, -2.0, -2.5], finish_reason="stop", weight_version=0, cell="c",
                         timing=TIMING)  # fmt: skip
        out.append(Rollout(execution_id=f"{task}{j}", group=task, reward=reward, records=[rec]))
    return out


def test_groups_that_scored_alike_are_not_computed_and_the_gradient_is_the_same(tiny_model: Path) -> None:
    """A zero-advantage execution adds nothing to the clipped surrogate: skipping it saves its forward and backward
    and leaves the step's gradient as it was (the others keep their 1 / E weights)."""
    from gyre.train.objective import compute_gradients
    from gyre.train.state import flat_gradient, load_model

    rollouts = _group("a", [1.0, 0.0, 1.0, 0.0]) + _group("b", [1.0] * 4) + _group("c", [0.0] * 4)

    def step_gradient(skip: bool) -> tuple[torch.Tensor, int, int]:
        data = build_step(rollouts, jmax=None, skip_zero_advantage=skip)
        model = load_model(tiny_model)
        for m in data.micro_steps:
            compute_gradients(model, m, LossConfig(), policy_version=0)
        return flat_gradient(model).clone(), data.computed_tokens, data.skipped

    full, full_tokens, none_skipped = step_gradient(False)
    lean, lean_tokens, skipped = step_gradient(True)
    assert (none_skipped, skipped) == (0, 8)  # groups b (all passed) and c (all failed)
    assert lean_tokens * 3 == full_tokens  # a third of the work
    assert full.abs().sum() > 0
    torch.testing.assert_close(lean, full, rtol=1e-5, atol=1e-9)
    flat = build_step(_group("b", [1.0] * 4), skip_zero_advantage=True)
    assert flat.micro_steps == [] and flat.executions == flat.skipped == 4


def test_zero_advantage_is_computed_when_the_loss_has_a_kl_term() -> None:
    from gyre.config import TrajectoryConfig
    from gyre.train import build_step_from_config

    rollouts = _group("b", [1.0] * 4)
    assert build_step_from_config(rollouts, TrajectoryConfig()).skipped == 4
    assert build_step_from_config(rollouts, TrajectoryConfig(), kl_coef=0.01).skipped == 0  # KL trains them
    assert build_step_from_config(rollouts, TrajectoryConfig(skip_zero_advantage=False)).skipped == 0
    # a group that scored alike has advantage exactly 0, whatever the rounding of its mean (0.1 * 3 / 3 != 0.1)
    assert set(group_advantages(_group("d", [0.1] * 3)).values()) == {0.0}

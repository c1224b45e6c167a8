"""The ``[trajectory]`` settings drive step building; advantages are group-relative."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre.config import load_config
from gyre.errors import ConfigError
from gyre.journal.records import CallRecord, CallTiming
from gyre.train import Rollout, build_step_from_config, group_advantages

TIMING = CallTiming(submitted_s=0.0, first_token_s=None, finished_s=0.0)


def record(
    call_id: str, new: list[int], out: list[int], parent: str | None = None, prefix: int = 0
) -> CallRecord:
    return CallRecord(call_id=call_id, session="s", role="main", parent_call_id=parent, prefix_len=prefix,
                      new_input_ids=new, output_ids=out, output_logprobs=[-0.1] * len(out), finish_reason="stop",
                      weight_version=3, cell="c", timing=TIMING)  # fmt: skip


def branchy(n: int) -> list[CallRecord]:
    """``n`` branches from one prompt, each sampling different tokens."""
    return [record(f"c{i}", [1, 2, 3], [10 + i, 20 + i]) for i in range(n)]


def test_trajectory_section_configures_selection_and_packing(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[trajectory]\njmax = 0\npacking = "path"\nmicro_step_tokens = 5\nadvantage = "mean"\n')
    cfg = load_config(path).trajectory
    rollouts = [
        Rollout(execution_id="a", group="t", reward=1.0, records=branchy(4)),
        Rollout(execution_id="b", group="t", reward=0.0, records=branchy(1)),
    ]
    step = build_step_from_config(rollouts, cfg)
    assert step.paths == {"a": 4, "b": 1}  # jmax = 0: unbounded
    assert all(m.sequences == 1 for m in step.micro_steps)  # 5-token sequences, budget 5: one per micro-step
    assert step.advantages == {"a": 0.5, "b": -0.5}  # mean only
    limited = build_step_from_config(rollouts, load_config(None, ["trajectory.jmax=2"]).trajectory)
    assert limited.paths == {"a": 2, "b": 1}
    with pytest.raises(ConfigError, match="packing"):
        load_config(None, ['trajectory.packing="flat"'])


def test_advantages_are_group_relative_without_dropped_executions() -> None:
    rollouts = [
        Rollout(execution_id="a1", group="a", reward=1.0, records=[]),
        Rollout(execution_id="a2", group="a", reward=0.0, records=[]),  # a placeholder stays in its group
        Rollout(execution_id="a3", group="a", reward=1.0, records=[], dropped=True),  # leaves it
        Rollout(execution_id="b1", group="b", reward=0.7, records=[]),
    ]
    adv = group_advantages(rollouts)
    assert set(adv) == {"a1", "a2", "b1"}
    assert adv["a1"] == pytest.approx(1.0, abs=1e-4) and adv["a2"] == pytest.approx(-1.0, abs=1e-4)
    assert adv["b1"] == 0.0  # alone in its group: nothing to compare against
    assert group_advantages(rollouts, "mean")["a1"] == pytest.approx(0.5)

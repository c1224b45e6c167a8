"""What the quickstart concludes from its numbers: paired gains, the verdict in words, the pretraining corpus and the
seeded calls that make two evaluations comparable execution by execution."""

from __future__ import annotations

import random

from gyre.agents.contract import AgentContext
from gyre.agents.toolagent import call_seed
from gyre.driver.evaluation import paired_difference
from gyre.driver.pretrain import session
from gyre.driver.quickstart import Gain, Point, first_call_floor, judge
from gyre.tasks.toy import make_task


def point(phase: str, mean: float, low: float, high: float, passed: float = 0.5, ok: float = 1.0) -> Point:
    return Point(
        phase=phase, mean=mean, ci_low=low, ci_high=high, pass_rate=passed, executions=64, well_formed=ok
    )


def gain(before: str, after: str, mean: float, low: float, high: float) -> Gain:
    return Gain(before=before, after=after, mean=mean, ci_low=low, ci_high=high, pairs=64)


def test_pairing_removes_what_the_tasks_share() -> None:
    rng = random.Random(0)
    hardness = {f"t{i}/0": rng.random() for i in range(64)}  # most of the spread is the tasks'
    before = {k: h for k, h in hardness.items()}
    after = {k: min(1.0, h + 0.05) for k, h in hardness.items()}
    paired = paired_difference(before, after)
    assert paired.pairs == 64 and paired.clear and 0.03 < paired.mean <= 0.05
    # unpaired, the two means' intervals overlap: the same +0.05 would not be seen
    assert not paired_difference(before, {"other": 1.0}).pairs


def test_learned_only_when_each_phase_beats_the_one_before_beyond_its_interval() -> None:
    base, sft, rl = (
        point("base", 0.0, 0.0, 0.0, 0.0, 0.0),
        point("sft", 0.5, 0.4, 0.6),
        point("rl", 0.7, 0.6, 0.8),
    )
    learned, failed, verdict = judge([base, sft, rl], [gain("base", "sft", 0.5, 0.4, 0.6),
                                                       gain("sft", "rl", 0.2, 0.1, 0.3)], 0.3, 48, 10)  # fmt: skip
    assert learned and failed == "" and verdict.startswith("Learned")
    learned, failed, verdict = judge([base, sft, rl], [gain("base", "sft", 0.5, 0.4, 0.6),
                                                       gain("sft", "rl", 0.05, -0.02, 0.1)], 0.3, 48, 10)  # fmt: skip
    assert not learned and failed == "rl" and "within the noise" in verdict


def test_the_verdict_names_the_likeliest_reason() -> None:
    zero = point("base", 0.0, 0.0, 0.0, 0.0, 0.0)
    broken = point("sft", 0.0, 0.0, 0.0, 0.0, 0.02)
    _, failed, verdict = judge([zero, broken, broken], [gain("base", "sft", 0, 0, 0), gain("sft", "rl", 0, 0, 0)],
                               0.3, 48, 48)  # fmt: skip
    assert failed == "sft" and "format is broken: 98% of its executions" in verdict
    first_only = point("sft", 0.3, 0.25, 0.35, 0.0, 0.95)  # well formed, stuck at the first call's floor
    _, failed, verdict = judge([zero, first_only, first_only],
                               [gain("base", "sft", 0.3, 0.25, 0.35), gain("sft", "rl", 0, 0, 0)], 0.3, 48, 48)  # fmt: skip
    assert failed == "sft" and "copies wrong names" in verdict
    sft = point("sft", 0.5, 0.4, 0.6)
    _, failed, verdict = judge([zero, sft, sft], [gain("base", "sft", 0.5, 0.4, 0.6), gain("sft", "rl", 0, 0, 0)],
                               0.3, 48, 48)  # fmt: skip
    assert failed == "rl" and "no reward signal" in verdict


def test_the_first_call_floor_is_one_trail_entry_of_each_chain() -> None:
    floor = first_call_floor(64)
    assert 0.2 < floor < 0.5
    assert first_call_floor(1) == 1 / (int(make_task(0, seed=7).metadata["chain_length"]) + 1)


def test_every_copy_in_a_pretraining_session_is_the_name_printed_last() -> None:
    rng = random.Random(3)
    for _ in range(200):
        text, copies = session(rng)
        assert copies and text.isascii()
        for at, size in copies:
            name = text[at : at + size]
            assert name.isdigit() and len(name) in (3, 4)
            before = (
                text[:at].replace("head -1", "").replace("tail -n 1", "")
            )  # digits of verbs are not names
            printed = [w for w in before.replace("[", " ").replace("]", " ").split() if w.isdigit()]
            assert printed[-1] == name  # the latest digits shown before the command


def test_seeded_calls_draw_the_same_numbers_for_the_same_execution_and_call() -> None:
    def ctx(task: str, group: int) -> AgentContext:
        return AgentContext(execution_id="x", task=make_task(0) if task == "a" else make_task(1), client=None,  # type: ignore[arg-type]
                            sandbox=None, deadline=0.0, group_index=group)  # type: ignore[arg-type]  # fmt: skip

    assert call_seed(0, ctx("a", 0), "main", 3) == call_seed(0, ctx("a", 0), "main", 3)
    seeds = {
        call_seed(s, ctx(t, g), "main", c) for s in (0, 1) for t in "ab" for g in (0, 1) for c in range(4)
    }
    assert len(seeds) == 32 and all(0 <= x < 2**63 for x in seeds)

"""Held micro-steps (computed, their gradient still in a member's local sum): a sum is taken whole or not at all,
and a member lost before sending gives back exactly what it held."""

from __future__ import annotations

from gyre.protocol import MicroStats, MicroStep
from gyre.train.queue import StepQueue


def micro(n: int = 3) -> MicroStep:
    return MicroStep(input_ids=[1] * n, position_ids=list(range(n)), parents=[-1, *range(n - 1)],
                     weights=[0.0] + [0.5] * (n - 1), advantages=[1.0] * n, behaviour_logprobs=[-1.0] * n,
                     versions=[0] * n, sequences=1)  # fmt: skip


def claim_and_hold(q: StepQueue, member: str, count: int) -> list[int]:
    out = []
    for _ in range(count):
        claimed = q.claim(member)
        assert claimed is not None
        assert q.hold(claimed[0], member, MicroStats(tokens=1))
        out.append(claimed[0])
    return out


def test_a_sum_marks_every_micro_step_it_covers_done_at_once() -> None:
    q, summed = StepQueue(), []
    q.add([micro() for _ in range(4)], seal=True)
    held = claim_and_hold(q, "a", 3)
    assert q.held_by("a") == held and q.done_count == 0 and q.has_pending()
    assert q.finish_sum(held, "a", lambda: summed.append("a"))
    assert summed == ["a"] and q.done_count == 3 and q.held_by("a") == [] and q.by_member["a"] == 3
    assert len(q.stats) == 3
    assert not q.finish_sum(held, "a", lambda: summed.append("again"))  # already done: never twice
    assert summed == ["a"] and q.discarded == 3


def test_a_lost_member_gives_back_its_held_micro_steps_and_its_late_sum_is_refused() -> None:
    q, summed = StepQueue(), []
    q.add([micro() for _ in range(5)], seal=True)
    lost = claim_and_hold(q, "lost", 3)
    kept = claim_and_hold(q, "kept", 2)
    assert sorted(q.release("lost")) == sorted(lost)  # killed before sending: only its own go back
    assert q.held_by("lost") == [] and q.held_by("kept") == kept and q.reclaimed == 3
    again = claim_and_hold(q, "kept", 3)
    assert sorted(again) == sorted(lost)
    assert not q.finish_sum(lost, "lost", lambda: summed.append("lost"))  # it came back: not counted
    assert q.held_by("kept") == sorted(kept + again)  # (the refused sum took nothing from the new holder)
    assert q.finish_sum(q.held_by("kept"), "kept", lambda: summed.append("kept"))
    assert q.complete and summed == ["kept"] and dict(q.by_member) == {"kept": 5}


def test_a_sum_covering_a_micro_step_the_member_does_not_hold_is_refused_whole() -> None:
    q, summed = StepQueue(), []
    q.add([micro() for _ in range(3)], seal=True)
    held = claim_and_hold(q, "a", 2)
    assert not q.finish_sum([*held, 2], "a", lambda: summed.append("a"))  # 2 was never held by a
    assert summed == [] and q.held_by("a") == [] and q.discarded == 3
    assert q.has_pending() and q.reclaimed == 2  # what it held goes back, to be computed again
    assert not q.hold(7, "a", MicroStats())  # no such micro-step

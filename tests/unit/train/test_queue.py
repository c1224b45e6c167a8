"""The step's micro-step queue: each gradient summed once, claims given back go first, strangers are refused."""

from __future__ import annotations

from gyre.protocol import MicroStats, MicroStep
from gyre.train.queue import StepQueue, check_micro_step


def micro(n: int = 3) -> MicroStep:
    return MicroStep(input_ids=[1] * n, position_ids=list(range(n)), parents=[-1, *range(n - 1)],
                     weights=[0.0] + [0.5] * (n - 1), advantages=[1.0] * n, behaviour_logprobs=[-1.0] * n,
                     versions=[0] * n, sequences=1)  # fmt: skip


def test_each_micro_step_is_summed_once_and_only_from_a_member_that_holds_it() -> None:
    q, summed = StepQueue(), []
    q.add([micro(), micro()], seal=True)
    assert q.claim("a") == (0, q.items[0]) and q.claim("b") == (1, q.items[1])
    assert not q.finish(1, "a", MicroStats(), lambda: summed.append("a1"))  # a never held 1
    assert q.release("b") == [1]  # b went silent: 1 goes back first
    assert q.claim("c") == (1, q.items[1])
    assert q.finish(1, "c", MicroStats(), lambda: summed.append("c1"))
    assert not q.finish(1, "b", MicroStats(), lambda: summed.append("b1"))  # b's late gradient
    assert not q.finish(7, "a", MicroStats(), lambda: summed.append("a7"))  # no such micro-step
    assert not q.complete
    assert q.finish(0, "a", MicroStats(), lambda: summed.append("a0"))
    assert q.complete and summed == ["c1", "a0"] and q.discarded == 3 and q.reclaimed == 1
    assert dict(q.by_member) == {"c": 1, "a": 1}


def test_bad_micro_steps_are_named() -> None:
    assert check_micro_step(micro(), 10) is None
    assert "vocabulary" in (check_micro_step(micro(), 1) or "")
    bad = MicroStep(input_ids=[1, 2], position_ids=[0, 1], parents=[-1, 0], weights=[0.0], advantages=[0.0, 0.0],
                    behaviour_logprobs=[0.0, 0.0], versions=[0, 0], sequences=1)  # fmt: skip
    assert "lengths" in (check_micro_step(bad, 10) or "")


def test_a_member_that_holds_fewer_tokens_never_claims_a_longer_micro_step() -> None:
    """A one-rank satellite (``trainer.max_tokens_per_rank = 8192``) passes a 64K-token micro-step by, in queue order,
    and takes the short ones behind it; the core cell (no bound: its ranks split it) claims it next."""
    q = StepQueue()
    q.add([micro(), micro(65_536), micro(), micro(9_000)], seal=True)
    assert q.claim("sat", 8192) == (0, q.items[0])
    assert q.has_pending_within(8192)
    assert q.claim("sat", 8192) == (2, q.items[2])
    assert q.claim("sat", 8192) is None and not q.has_pending_within(8192)
    assert q.claim("core") == (1, q.items[1])  # the long ones kept their place
    assert q.claim("core") == (3, q.items[3])
    assert q.claim("core") is None

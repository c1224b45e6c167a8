"""``[chaos] verifier_start_fail``: which verifier sandbox starts fail is a function of the seed, the execution and
the attempt (not of the order verifications run in), and a verifier whose every start fails drops, never scores."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gyre.config import ChaosConfig
from gyre.control.chaos import FaultyStarts
from gyre.tasks import Verifier, load_task

DATA = Path(__file__).parents[1] / "tasks" / "data"
SOLVED = {"calc.py": "def add(a, b):\n    return a + b\n"}


def test_the_same_seed_fails_the_same_starts_in_any_order_at_about_the_rate() -> None:
    keys = [(f"e{i:06d}.0/t/0", a) for i in range(400) for a in (1, 2, 3)]
    first = FaultyStarts(ChaosConfig(verifier_start_fail=0.3, seed=4))
    second = FaultyStarts(ChaosConfig(verifier_start_fail=0.3, seed=4))
    forward = [first.fails(k, a) for k, a in keys]
    backward = [second.fails(k, a) for k, a in reversed(keys)][::-1]
    assert forward == backward
    assert 0.25 < sum(forward) / len(forward) < 0.35
    assert first.counts() == {"verifier_starts": len(keys), "verifier_starts_failed": sum(forward)}
    other = FaultyStarts(ChaosConfig(verifier_start_fail=0.3, seed=5))
    assert [other.fails(k, a) for k, a in keys] != forward
    off = FaultyStarts(ChaosConfig())
    assert not off.active and not any(off.fails(k, a) for k, a in keys[:50])


@pytest.mark.slow(reason="real sandboxes that fail to start, then a retry that grades (7 s)")
def test_a_verifier_whose_sandbox_never_starts_drops_with_the_reason_and_one_that_starts_on_a_retry_scores(
    tmp_path: Path,
) -> None:
    def fault(key: str, attempt: int) -> bool:
        return key == "dead" or (key == "flaky" and attempt == 1)

    verifier = Verifier(retries=2, retry_delay_s=0.01, start_fault=fault)
    task = load_task(DATA / "gyre-add")
    verdicts = {}
    for key in ("dead", "flaky", "fine"):
        ws = tmp_path / key
        ws.mkdir()
        for name, text in SOLVED.items():
            (ws / name).write_text(text)
        verdicts[key] = asyncio.run(verifier.verify(task, ws, key))
    dead = verdicts["dead"]
    assert (dead.outcome, dead.score, dead.attempts, dead.trainable) == ("dropped", 0.0, 3, False)
    first_line = dead.detail.splitlines()[0]
    assert "failed on every attempt (3)" in first_line and "sandbox failed to start" in first_line
    assert (verdicts["flaky"].outcome, verdicts["flaky"].score, verdicts["flaky"].attempts) == (
        "scored",
        1.0,
        2,
    )
    assert (verdicts["fine"].outcome, verdicts["fine"].score, verdicts["fine"].attempts) == ("scored", 1.0, 1)
    assert verifier.statistics().by_outcome == {"dropped": 1, "scored": 2}

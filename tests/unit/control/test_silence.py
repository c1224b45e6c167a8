"""Who is silent: a peer against its timeout while another is heard; every one of several quiet at once against
ALL_QUIET timeouts (the machine or network they share stood still); a lone peer against its own timeout. The
listener's own stall is nobody's silence; a ManualClock wakes a sleeper only once moved past its time."""

from __future__ import annotations

import asyncio

from gyre.control.silence import ALL_QUIET, ManualClock, StallClock, credit, silent


def test_one_peer_quiet_among_heard_ones_is_silent_past_its_timeout() -> None:
    assert silent({"a": 100.0, "b": 69.0}, now=100.0, timeout_s=30.0) == {"b": 31.0}
    assert silent({"a": 100.0, "b": 71.0}, now=100.0, timeout_s=30.0) == {}


def test_every_peer_quiet_at_once_is_given_all_quiet_timeouts() -> None:
    quiet = {"a": 60.0, "b": 59.0}  # neither heard for 40 s: together, not one by one
    assert silent(quiet, now=100.0, timeout_s=30.0) == {}
    late = 60.0 + ALL_QUIET * 30.0 + 1
    assert silent(quiet, now=late, timeout_s=30.0) == {"a": late - 60.0, "b": late - 59.0}


def test_a_lone_peer_is_judged_against_its_own_timeout() -> None:
    assert silent({"a": 69.0}, now=100.0, timeout_s=30.0) == {"a": 31.0}


def test_the_listeners_stall_is_credited_to_every_peer() -> None:
    clock = ManualClock(0.0)
    stall = StallClock(1.0, clock.now)
    clock.advance(1.0)
    assert stall.stalled() == 0.0  # on time
    clock.advance(50.0)
    stalled = stall.stalled()
    assert stalled == 49.0  # a whole interval late: it stood still
    assert credit(last_seen=0.0, stalled_s=stalled, now=clock.now()) == 49.0
    assert credit(last_seen=0.0, stalled_s=0.0, now=clock.now()) == 0.0


def test_a_manual_clock_wakes_a_sleeper_only_once_moved_past_its_time() -> None:
    async def main() -> list[float]:
        clock, woke = ManualClock(0.0), []

        async def sleeper() -> None:
            await clock.sleep(5.0)
            woke.append(clock.now())

        task = asyncio.ensure_future(sleeper())
        await asyncio.sleep(0)
        clock.advance(4.0)
        await asyncio.sleep(0)
        assert woke == []
        clock.advance(2.0)
        await task
        return woke

    assert asyncio.run(main()) == [6.0]

"""Judging silence fairly: a peer is not silent while the one listening for it stood still, nor while every peer went
quiet at once.

The controller (cells), the shard hub (runtime shards) and the core trainer (members) each sweep their peers every
heartbeat and call one silent for longer than a timeout gone. Two things look like silence and are not:

- **The listener stood still** (a loaded CI machine, the hypervisor taking the VM away, a long stop of the world):
  its overdue sweep runs the moment it is back, before the peers, frozen just as long, have sent a beat. `StallClock`
  tells the sweep how long it stood still, and `credit` counts none of that time as anyone's silence.
- **Every peer went quiet at once** while the listener ran: the machine or the network they share stood still (every
  shard of a two-core CI machine starved together; a switch rebooting). One peer dying is told from that by its peers
  still being heard: `silent` judges a peer against the timeout while another was heard within it, and against
  `ALL_QUIET` timeouts when none of two or more was.

Time comes from a `Clock`: the system's, or a `ManualClock` that moves only when a test (or a simulation) advances
it, so a test of these detectors steps through a minute of silence in milliseconds instead of sleeping through it,
and no loaded machine can make it flake.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

ALL_QUIET = 3.0  # when no peer was heard within the timeout, each one is judged against this many timeouts

K = TypeVar("K")


class Clock(Protocol):
    """Where a detector reads the time and waits for its next sweep."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """`time.monotonic` and `asyncio.sleep`."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


SYSTEM = SystemClock()


class ManualClock:
    """Time that moves only when ``advance`` moves it; ``sleep`` returns once it has moved that far."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        future = asyncio.get_running_loop().create_future()
        self._sleepers.append((self._now + seconds, future))
        await future

    def advance(self, seconds: float) -> None:
        """Move the time on; every sleeper due by then wakes (when its loop next runs)."""
        self._now += seconds
        due = [future for at, future in self._sleepers if at <= self._now]
        self._sleepers = [(at, future) for at, future in self._sleepers if at > self._now]
        for future in due:
            if not future.done():
                future.set_result(None)


class StallClock:
    """``stalled()`` once per sweep: the seconds the sweep ran past its due time beyond one interval (0.0 on time)."""

    def __init__(self, interval_s: float, now: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self._now = interval_s, now
        self._due = now() + interval_s

    def stalled(self) -> float:
        now = self._now()
        late = now - self._due
        self._due = now + self.interval_s
        # a sweep a little late is the scheduler's jitter; a whole interval late, the listener stood still
        return late if late > self.interval_s else 0.0


def credit(last_seen: float, stalled_s: float, now: float) -> float:
    """A peer's last-seen time with ``stalled_s`` of the listener's stall not counted against it."""
    return min(now, last_seen + stalled_s) if stalled_s else last_seen


def silent(last_seen: Mapping[K, float], now: float, timeout_s: float) -> dict[K, float]:
    """The peers to judge gone, with their seconds of silence: over ``timeout_s`` while another peer was heard within
    it; over ``ALL_QUIET * timeout_s`` when none of two or more was (every one quiet at once: the machine or network
    they share stood still, which is nobody's death; if they all died, they are gone a little later). A lone peer
    has no other to be judged against: its own timeout."""
    if not last_seen:
        return {}
    together = len(last_seen) > 1 and now - max(last_seen.values()) > timeout_s
    limit = ALL_QUIET * timeout_s if together else timeout_s
    return {peer: now - seen for peer, seen in last_seen.items() if now - seen > limit}

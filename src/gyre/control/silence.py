"""Judging silence fairly: a peer is not silent while the one listening for it stood still.

The controller (cells) and the core trainer (members) each sweep their peers every heartbeat and call one silent for
longer than a timeout gone. When the listener's own process or machine stood still (a loaded CI machine, the
hypervisor taking the VM away, a long stop of the world), its overdue sweep ran the moment it was back, before the
peers, frozen just as long, had sent a beat: every peer at once looked silent for the whole stall. `StallClock` tells
the sweep how long it stood still, and the sweep counts none of that time as anyone's silence.
"""

from __future__ import annotations

import time


class StallClock:
    """``stalled()`` once per sweep: the seconds the sweep ran past its due time beyond one interval (0.0 on time)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._due = time.monotonic() + interval_s

    def stalled(self) -> float:
        now = time.monotonic()
        late = now - self._due
        self._due = now + self.interval_s
        # a sweep a little late is the scheduler's jitter; a whole interval late, the listener stood still
        return late if late > self.interval_s else 0.0


def credit(last_seen: float, stalled_s: float) -> float:
    """A peer's last-seen time with ``stalled_s`` of the listener's stall not counted against it."""
    return min(time.monotonic(), last_seen + stalled_s) if stalled_s else last_seen

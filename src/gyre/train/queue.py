"""The micro-step queue of the open step: who holds which micro-step, and which are done (thread-safe).

A micro-step is pending (nobody holds it), claimed (a member computes it), held (computed: its gradient waits in
the member's local sum, ``hold``) or done (its gradient is in the step's sum). A satellite sends the sum of all it
holds once (``finish_sum``); the core's own worker adds each gradient as it computes it (``finish``).

Invariant: a micro-step's gradient is added to the step's sum exactly once. ``finish`` / ``finish_sum`` add and mark
done under one lock, and refuse a micro-step that is already done or that the member no longer holds (a member
declared gone that comes back, or a claim given out twice after a member went silent): such a gradient is counted as
discarded, never added. A sum is all or nothing: one it cannot take whole is discarded, and whatever of it the
member still held goes back to the queue. A member that leaves or goes silent gives its unfinished claims, held ones
included, back to the front of the queue, so a lost member costs only its own unsent micro-steps.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable

from gyre.protocol import MicroStats, MicroStep
from gyre.train.loss import sequence_bounds


def check_micro_step(micro: MicroStep, vocab_size: int) -> str | None:
    """What is wrong with a submitted micro-step (None: nothing), so bad input is refused at the door instead of
    failing a member mid-step."""
    n = len(micro.input_ids)
    lengths = {len(getattr(micro, f)) for f in ("position_ids", "parents", "weights", "advantages",
                                                  "behaviour_logprobs", "versions")}  # fmt: skip
    if n == 0 or lengths != {n}:
        return (
            f"its per-token lists have lengths {sorted(lengths)} for {n} input ids (all must be equal, > 0)"
        )
    if not all(0 <= t < vocab_size for t in micro.input_ids):
        return f"an input id lies outside the model's vocabulary of {vocab_size}"
    if min(micro.position_ids) < 0:
        return "a position id is negative"
    if not all(math.isfinite(w) and w >= 0 for w in micro.weights):
        return "a loss weight is negative, NaN or infinite"
    if not all(math.isfinite(x) for x in (*micro.advantages, *micro.behaviour_logprobs)):
        return "an advantage or behaviour logprob is NaN or infinite"
    try:
        sequence_bounds(micro.parents)
    except ValueError as exc:
        return str(exc)
    return None


class StepQueue:
    """Micro-steps of one step at a time; a step is complete when it is sealed and every micro-step is done."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # notified on new work and on completion
        self.step = 0
        self._reset()

    def _reset(self) -> None:
        self.items: list[MicroStep] = []
        self.done: list[bool] = []
        self.pending: deque[int] = deque()
        self.holders: dict[int, set[str]] = {}  # index -> members holding it
        self.held: dict[str, dict[int, MicroStats]] = {}  # member -> computed micro-steps not yet received
        self.sealed = False
        self.stats: list[MicroStats] = []
        self.by_member: Counter[str] = Counter()
        self.discarded = 0
        self.reclaimed = 0
        self.started_s: float | None = None
        self.done_count = 0
        self.bytes_in = 0  # gradient bytes members sent for this step (the core's statistics)

    def open(self, step: int) -> None:
        """Start step ``step`` with no micro-steps yet."""
        with self.lock:
            self.step = step
            self._reset()
            self.changed.notify_all()

    def add(self, items: list[MicroStep], seal: bool = False) -> None:
        """Append micro-steps to the open step (it streams in); ``seal`` when none will follow."""
        with self.lock:
            if self.sealed and items:
                raise ValueError(f"step {self.step} is sealed; its micro-steps can no longer grow")
            start = len(self.items)
            self.items += items
            self.done += [False] * len(items)
            self.pending.extend(range(start, start + len(items)))
            self.sealed = self.sealed or seal
            self.changed.notify_all()

    def claim(self, member: str, max_tokens: int = 0) -> tuple[int, MicroStep] | None:
        """The next unclaimed micro-step for ``member`` of at most ``max_tokens`` tokens (0: any), or None; longer
        ones stay where they are in the queue, for a member that can hold them."""
        with self.lock:
            passed: list[int] = []
            found: int | None = None
            while self.pending:
                index = self.pending.popleft()
                if self.done[index]:
                    continue
                if max_tokens and len(self.items[index].input_ids) > max_tokens:
                    passed.append(index)
                    continue
                found = index
                break
            self.pending.extendleft(reversed(passed))
            if found is None:
                return None
            self.holders.setdefault(found, set()).add(member)
            if self.started_s is None:
                self.started_s = time.monotonic()
            return found, self.items[found]

    def has_pending_within(self, max_tokens: int) -> bool:
        """Whether a micro-step of at most ``max_tokens`` tokens (0: any) waits for a member."""
        with self.lock:
            return any(
                not self.done[i] and (not max_tokens or len(self.items[i].input_ids) <= max_tokens)
                for i in self.pending
            )

    def finish(self, index: int, member: str, stats: MicroStats, add: Callable[[], None]) -> bool:
        """Record ``member``'s gradient of ``index``: call ``add`` (which sums it) unless it is done already or
        ``member`` does not hold it (it was given back, or never claimed)."""
        with self.lock:
            held = self.holders.get(index, set())
            if not 0 <= index < len(self.items) or member not in held or self.done[index]:
                held.discard(member)
                self.discarded += 1
                return False
            held.discard(member)
            add()
            self.done[index] = True
            self.done_count += 1
            self.stats.append(stats)
            self.by_member[member] += 1
            self.changed.notify_all()
            return True

    def hold(self, index: int, member: str, stats: MicroStats) -> bool:
        """``member`` computed ``index``: its gradient waits in the member's local sum. False if it does not hold
        the claim (given back meanwhile): the sum that covers it will be refused."""
        with self.lock:
            if (
                not 0 <= index < len(self.items)
                or member not in self.holders.get(index, ())
                or self.done[index]
            ):
                return False
            self.held.setdefault(member, {})[index] = stats
            return True

    def held_by(self, member: str) -> list[int]:
        """The micro-steps ``member`` computed and has not sent yet."""
        with self.lock:
            return sorted(self.held.get(member, {}))

    def finish_sum(self, indices: list[int], member: str, add: Callable[[], None]) -> bool:
        """Record ``member``'s summed gradient of ``indices``: call ``add`` once and mark them all done, if the
        member holds every one of them computed (and none is done); otherwise discard the sum whole and give back
        what of it the member still held."""
        with self.lock:
            held = self.held.get(member, {})
            if not indices or len(set(indices)) != len(indices) or any(i not in held for i in indices):
                self.discarded += len(indices)
                self._give_back(member, [i for i in indices if i in held])
                return False
            add()
            for i in indices:
                self.holders[i].discard(member)
                self.done[i] = True
                self.stats.append(held.pop(i))
            self.done_count += len(indices)
            self.by_member[member] += len(indices)
            self.changed.notify_all()
            return True

    def _give_back(self, member: str, indices: list[int]) -> None:
        for i in indices:
            self.holders[i].discard(member)
            self.held.get(member, {}).pop(i, None)
            if not self.holders[i]:
                self.pending.appendleft(i)
        self.reclaimed += len(indices)
        if indices:
            self.changed.notify_all()

    def release(self, member: str, keep: set[int] | None = None) -> list[int]:
        """Give ``member``'s unfinished claims back, held ones included (except ``keep``: gradients already on
        their way)."""
        with self.lock:
            back = [
                i
                for i, held in self.holders.items()
                if member in held and not self.done[i] and i not in (keep or set())
            ]
            self._give_back(member, back)
            return back

    def claims(self) -> dict[str, list[int]]:
        """Member -> indices it holds now."""
        with self.lock:
            out: dict[str, list[int]] = {}
            for i, held in sorted(self.holders.items()):
                for member in held:
                    if not self.done[i]:
                        out.setdefault(member, []).append(i)
            return out

    @property
    def complete(self) -> bool:
        """Sealed, and every micro-step's gradient is in the sum."""
        with self.lock:
            return self.sealed and self.done_count == len(self.items)

    def has_pending(self) -> bool:
        """Some micro-step waits for a member."""
        with self.lock:
            return any(not self.done[i] for i in self.pending)

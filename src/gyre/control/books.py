"""Where a run's executions and steps stand: the counters the policy's `Observation` is built from.

Kept the same way by the live loop (`gyre.control.loop`) and the simulator (`gyre.sim`), from the same events, so
both ask the policy the same question. Pure: no I/O, no clock.

Every change is kept in ``events`` (method and arguments), so a live run's decisions can be replayed on fresh books
(`replay`). Executions are numbered in dispatch order; execution ``i`` trains in step ``i // batch_executions`` and
belongs to burst ``i // (batch_executions * burst_steps)``; with carry-over (``land``) it trains instead in the
first step not yet full when its group finishes, so a step need not wait for its slowest execution. An execution is
*ready* once it finished and until a trainer takes its data; the step being trained is *running* from the first
data taken until its update is applied.
"""

from __future__ import annotations

from gyre.control.policy import CellView, Observation


class Books:
    """Dispatched / finished / taken / applied, per burst and per step."""

    def __init__(self, batch_executions: int, burst_steps: int, steps: int) -> None:
        self.batch, self.burst_size = batch_executions, batch_executions * burst_steps
        self.burst_steps, self.steps = burst_steps, steps
        self.total = steps * batch_executions
        self.dispatched = self.finished = 0
        self.unfinished_in_burst: dict[int, int] = {}
        self.ready: dict[int, int] = {}  # step -> finished executions whose data no trainer took yet
        self.sampled_with: list[int] = []  # execution -> the weight version serving when it was dispatched
        self.train_step = 0  # the step trained now (or next)
        self.version = 0  # weights serving cells sample with (steps applied)
        self.taken = 0  # executions of train_step whose data a trainer took
        self.events: list[tuple[str, int, int]] = []  # every change, in order: (what, arguments)
        self.members: dict[int, list[int]] = {}  # carry-over: step -> the executions that landed in it
        self.landing = 0  # carry-over: the first step not yet full

    def observation(
        self, cells: tuple[CellView, ...], pending: bool = False, max_staleness: int = 1
    ) -> Observation:
        """What the policy sees now; ``pending``: data handed to the trainer that no trainer claimed yet. Later
        bursts are offered (``next_burst``) as far as their executions would train at most ``max_staleness``
        versions after the weights serving now."""
        current = self.current_burst()
        undispatched = max(min((current + 1) * self.burst_size, self.total) - self.dispatched, 0)
        next_start = (current + 1) * self.burst_size
        horizon = max(next_start + self.burst_size, (self.version + max_staleness + 1) * self.batch)
        next_count = max(min(horizon, self.total) - max(self.dispatched, next_start), 0)
        return Observation(
            cells=cells, in_flight=self.dispatched - self.finished, undispatched=undispatched,
            undispatched_step=self.dispatched // self.batch, next_burst=next_count,
            data_ready=self.ready.get(self.train_step, 0) > 0 or pending, step_running=self.taken > 0,
            version=self.version, next_burst_step=max(self.dispatched, next_start) // self.batch,
        )  # fmt: skip

    def current_burst(self) -> int:
        """The first burst with executions still to finish (the current one)."""
        b = 0
        while (
            (b + 1) * self.burst_size < self.total
            and (b + 1) * self.burst_size <= self.dispatched
            and not self.unfinished_in_burst.get(b)
        ):
            b += 1
        return b

    def dispatch(self, count: int) -> range:
        """Record ``count`` more executions dispatched now; their indices."""
        self.events.append(("dispatch", count, 0))
        first = self.dispatched
        for i in range(first, first + count):
            self.sampled_with.append(self.version)
            burst = i // self.burst_size
            self.unfinished_in_burst[burst] = self.unfinished_in_burst.get(burst, 0) + 1
        self.dispatched += count
        return range(first, first + count)

    def finish(self, index: int, ready: bool = True) -> None:
        """Execution ``index`` finished; its data is ready for its step (or later: ``make_ready``, once its group is
        complete)."""
        self.events.append(("finish", index, int(ready)))
        self.finished += 1
        self.unfinished_in_burst[index // self.burst_size] -= 1
        if ready:
            self.make_ready(index // self.batch, 1, _log=False)

    def make_ready(self, step: int, count: int, _log: bool = True) -> None:
        """``count`` finished executions of ``step`` have trainable data now (a whole group)."""
        if _log:
            self.events.append(("ready", step, count))
        self.ready[step] = self.ready.get(step, 0) + count

    def take(self, count: int = 1) -> None:
        """A trainer took the data of ``count`` ready executions of the step trained now."""
        self.events.append(("take", count, 0))
        self.ready[self.train_step] -= count
        self.taken += count

    def land(self, first: int, count: int) -> int:
        """Carry-over: executions ``first .. first + count - 1`` (a whole group, finished) train in the first step not
        yet full, whichever step they were dispatched for; the step they landed in."""
        self.events.append(("land", first, count))
        step = self.landing
        members = self.members.setdefault(step, [])
        if len(members) + count > self.batch:
            raise ValueError(f"a group of {count} does not fit step {step}: groups must divide the batch")
        members.extend(range(first, first + count))
        if len(members) == self.batch:
            self.landing += 1
        return step  # (ready once the caller knows it has something to compute: ``make_ready``)

    def requeue(self, count: int = 1) -> None:
        """A trainer that took data of the step trained now was lost before computing it: the data is ready again."""
        self.events.append(("requeue", count, 0))
        self.ready[self.train_step] += count
        self.taken -= count

    def applied(self) -> list[int]:
        """The step trained now was applied: the version moves on. Returns its executions' staleness."""
        self.events.append(("applied", 0, 0))
        step = self.train_step
        members = self.members.get(step) or range(step * self.batch, (step + 1) * self.batch)
        lags = [step - self.sampled_with[i] for i in members]
        self.version, self.train_step, self.taken = self.version + 1, step + 1, 0
        return lags

    def step_of(self, index: int) -> int:
        """The step execution ``index`` was dispatched for (and trains in, unless it is carried over)."""
        return index // self.batch

    @property
    def done(self) -> bool:
        """Every step was applied."""
        return self.train_step >= self.steps


def replay(books: Books, events: list[tuple[str, int, int]]) -> None:
    """Apply recorded ``events`` to ``books`` (fresh ones of the same shape), as the run that kept them did."""
    for what, a, b in events:
        match what:
            case "dispatch":
                books.dispatch(a)
            case "finish":
                books.finish(a, ready=bool(b))
            case "ready":
                books.make_ready(a, b)
            case "take":
                books.take(a)
            case "land":
                books.land(a, b)
            case "requeue":
                books.requeue(a)
            case "applied":
                books.applied()
            case _:
                raise ValueError(f"not a books event: {what!r}")

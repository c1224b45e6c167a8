"""A discrete-event simulation of cells, executions and training steps, driven by the live controller's policy.

Modelled: execution durations drawn once per run (lognormal around a median with a chosen p99/p50 ratio, cut at the
time budget, so long tails pile up there) and shared by every mode, so modes are compared on the same executions;
serving capacity per cell; one micro-step per execution on one training cell (``micro_step_s``, or more for a longer
execution when training follows length); the core's update plus weight push (``apply_s``); switch costs each way.
A workload can move over the run (``[drift]``): horizons that grow, a tail that thickens then thins, tool-latency
bursts, cells lost and regained. Not modelled (yet): KV hand-over. Executions are not pinned to cells (a leaving or
lost cell's calls move, as the router moves them); the policy never dispatches past the serving capacity.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Iterable
from typing import Annotated, cast

import msgspec

from gyre.control.books import Books
from gyre.control.policy import CellView, Dispatch, Observation, PolicyConfig, Role, ToServe, ToTrain, decide

Positive = Annotated[float, msgspec.Meta(gt=0)]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Z99 = 2.3263  # p99 of a lognormal is exp(mu + 2.3263 sigma)


class Cluster(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The cells and what their work costs."""

    cells: Annotated[int, msgspec.Meta(ge=1)] = 4  # cells that serve and train (the core first)
    standalone: Annotated[int, msgspec.Meta(ge=0)] = 0  # cells that only serve
    capacity: Annotated[int, msgspec.Meta(ge=1)] = 16  # executions one serving cell hosts at once
    micro_step_s: Positive = 60.0  # one execution's training data on one cell, forward + backward
    apply_s: Positive = 30.0  # the optimizer update and the weight push after a step
    serve_to_train_s: NonNegative = 8.52  # published at 2.4T scale
    train_to_serve_s: NonNegative = 3.46
    decode_step_s: NonNegative = 0.0  # one decode step at batch 1 (multi-turn tasks)
    decode_step_growth: NonNegative = 0.0  # a step at batch b: x (1 + growth (b - 1))


class Tasks(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The executions of a run and how long they take."""

    steps: Annotated[int, msgspec.Meta(ge=1)] = 48
    batch_executions: Annotated[int, msgspec.Meta(ge=1)] = 64  # executions per step
    # executions of one task compared together (divides the batch)
    group_size: Annotated[int, msgspec.Meta(ge=1)] = 1
    burst_steps: Annotated[int, msgspec.Meta(ge=1)] = 1  # steps dispatched together as one burst
    duration_median_s: Positive = 1800.0
    duration_p99_over_p50: Annotated[float, msgspec.Meta(ge=1.0)] = 10.0  # tail heaviness
    budget_s: Positive = 14400.0  # an execution is cut (and scored partially) at this
    seed: int = 0
    turns: Annotated[int, msgspec.Meta(ge=0)] = 0  # model calls per execution; 0: one opaque duration each
    tokens_per_call: Annotated[int, msgspec.Meta(ge=1)] = 500  # decoded per call (multi-turn)


class Drift(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the workload moves over the run; the defaults keep it stationary.

    Over the run's steps (x from 0 at the first to 1 at the last): the median duration grows geometrically to
    ``horizon_growth`` times the first; the p99/p50 ratio is multiplied by ``1 + (tail_peak - 1) sin(pi x)`` (a
    tail that thickens then thins). An execution's training cost is ``micro_step_s (duration / median) **
    train_follows_length`` with the first step's median: 0 keeps it fixed, 1 makes it proportional to the
    execution's length (its tokens). Tool latency comes in bursts: from ``burst_every_s / 2`` on, every
    ``burst_every_s`` seconds of wall time, executions progress ``burst_slowdown`` times slower for
    ``burst_for_s``. Cells are lost and regained: every ``outage_every_s`` (the first at half of it),
    ``outage_cells`` cells (satellites in turn, never the core, whose loss stops a live run) are gone for
    ``outage_for_s`` and come back serving; a micro-step they held is computed again elsewhere. Binary rewards
    whose solve rate moves from ``solve_rate_start`` to ``solve_rate_end`` (linearly; both unset: every execution
    trains): each execution passes with that probability, and a group whose members all pass or all fail has
    advantage 0 and costs the trainer nothing (``trajectory.skip_zero_advantage``).
    """

    horizon_growth: Positive = 1.0
    tail_peak: Positive = 1.0
    train_follows_length: NonNegative = 0.0
    burst_every_s: NonNegative = 0.0  # 0: no bursts
    burst_for_s: NonNegative = 0.0
    burst_slowdown: Annotated[float, msgspec.Meta(ge=1.0)] = 1.0
    outage_every_s: NonNegative = 0.0  # 0: no outages
    outage_for_s: NonNegative = 0.0
    outage_cells: Annotated[int, msgspec.Meta(ge=0)] = 1
    solve_rate_start: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    solve_rate_end: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None

    def __post_init__(self) -> None:
        if (self.solve_rate_start is None) != (self.solve_rate_end is None):
            raise ValueError("drift: set both solve_rate_start and solve_rate_end, or neither")

    @property
    def stationary(self) -> bool:
        """Nothing moves."""
        return self == Drift()


class Trace(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A recorded run's executions, replayed instead of drawn: each one's duration in dispatch order (steps x
    batch_executions of them) and, optionally, each one's micro-step (else ``micro_step_s``)."""

    durations_s: list[Annotated[float, msgspec.Meta(ge=0)]]
    micro_steps_s: list[Annotated[float, msgspec.Meta(ge=0)]] = []


class Workload(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One simulated cluster and task distribution (a TOML file: ``[cluster]``, ``[tasks]``, ``[drift]``, and a
    recorded ``[trace]`` to replay)."""

    cluster: Cluster = msgspec.field(default_factory=Cluster)
    tasks: Tasks = msgspec.field(default_factory=Tasks)
    drift: Drift = msgspec.field(default_factory=Drift)
    trace: Trace | None = None

    def __post_init__(self) -> None:
        runs = self.tasks.steps * self.tasks.batch_executions
        if self.trace is not None and len(self.trace.durations_s) != runs:
            raise ValueError(f"the trace has {len(self.trace.durations_s)} durations; the workload runs {runs} "
                             f"executions ({self.tasks.steps} steps x {self.tasks.batch_executions})")  # fmt: skip
        if self.trace is not None and self.trace.micro_steps_s and len(self.trace.micro_steps_s) != runs:
            raise ValueError(
                f"the trace has {len(self.trace.micro_steps_s)} micro-steps for {runs} executions"
            )
        if self.tasks.batch_executions % self.tasks.group_size:
            raise ValueError(f"group_size {self.tasks.group_size} does not divide batch_executions "
                             f"{self.tasks.batch_executions}")  # fmt: skip


class Segment(msgspec.Struct, frozen=True):
    """A cell in one role from ``start_s`` to ``end_s``."""

    cell: str
    role: str
    start_s: float
    end_s: float


class SimResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one simulated run took."""

    mode: str
    overlap: bool
    total_s: float
    step_end_s: list[float]  # when each step's update was applied
    # of the cells' time while not lost: free serving slots, trainers without work, switching
    idle_fraction: float
    switches: int
    staleness_mean: float  # versions between the weights that began an execution and the step it trains in
    staleness_max: int
    timeline: list[Segment]
    idle_by_role: dict[
        str, float
    ] = {}  # the idle fraction's parts: free serving slots, trainers without work, switching
    async_train_cells: int = 0  # the fixed split of async and onestep
    # versions between a token's weights and the step it trains in (they change under a running execution), mean
    token_lag_mean: float = 0.0
    carried: int = 0  # executions that trained in a later step than the one they were dispatched for
    requeued: int = 0  # micro-steps computed again because the cell computing them was lost
    stints: int = 0  # spans of a cell in training of positive length (a cell moved back at once trains none)

    @property
    def switches_per_stint(self) -> float:
        """Role moves per training stint: 1 for a fixed split, 2 when each stint is one drain and one resume, more
        when cells bounce between roles without training."""
        return self.switches / max(self.stints, 1)


def durations(tasks: Tasks, drift: Drift | None = None) -> list[float]:
    """Every execution's duration, in dispatch order (the same for every mode); ``drift`` moves the distribution
    with the step an execution trains in, on the same random draws."""
    drift = drift or Drift()
    rng = random.Random(tasks.seed)
    out = []
    for i in range(tasks.steps * tasks.batch_executions):
        x = (i // tasks.batch_executions) / max(tasks.steps - 1, 1)
        median = tasks.duration_median_s * drift.horizon_growth**x
        ratio = max(tasks.duration_p99_over_p50 * (1 + (drift.tail_peak - 1) * math.sin(math.pi * x)), 1.0)
        out.append(min(rng.lognormvariate(math.log(median), math.log(ratio) / Z99), tasks.budget_s))
    return out


def executions(workload: Workload) -> list[float]:
    """Every execution's duration: the trace's, or drawn (`durations`)."""
    if workload.trace is not None:
        return list(workload.trace.durations_s)
    return durations(workload.tasks, workload.drift)


def training_costs(workload: Workload, times: list[float]) -> list[float]:
    """Each execution's micro-step on one cell."""
    cl, tk, dr = workload.cluster, workload.tasks, workload.drift
    if workload.trace is not None and workload.trace.micro_steps_s:
        return list(workload.trace.micro_steps_s)
    costs = [cl.micro_step_s * (t / tk.duration_median_s) ** dr.train_follows_length for t in times]
    if dr.solve_rate_start is None or dr.solve_rate_end is None:
        return costs
    rng = random.Random(f"rewards/{tk.seed}")  # apart from the durations' draws: the same executions
    size = tk.group_size
    for first in range(0, len(costs), size):
        x = (first // tk.batch_executions) / max(tk.steps - 1, 1)
        rate = dr.solve_rate_start + (dr.solve_rate_end - dr.solve_rate_start) * x
        passed = [rng.random() < rate for _ in range(size)]
        if all(passed) or not any(passed):
            costs[first : first + size] = [0.0] * size
    return costs


def stretched(drift: Drift, start: float, work: float) -> float:
    """When something needing ``work`` seconds of progress, started at ``start``, ends through the tool-latency
    bursts (progress ``burst_slowdown`` times slower inside one)."""
    every, length, slow = drift.burst_every_s, drift.burst_for_s, drift.burst_slowdown
    if not every or not length or slow == 1.0:
        return start + work
    t, left = start, work
    while True:
        k = math.floor((t - every / 2) / every)  # the last burst that began at or before t
        begun = every / 2 + k * every
        if k >= 0 and t < begun + length:  # inside burst k until its end
            inside = (begun + length - t) / slow
            if left <= inside:
                return t + left * slow
            left, t = left - inside, begun + length
        else:
            nxt = every / 2 + (k + 1) * every
            if left <= nxt - t:
                return t + left
            left, t = left - (nxt - t), nxt


class _Cell:
    __slots__ = ("busy", "epoch", "name", "role", "since", "standalone")

    def __init__(self, name: str, standalone: bool) -> None:
        self.name, self.standalone = name, standalone
        self.role: Role = "serving"
        self.since = 0.0
        self.busy: float | None = None  # training: the cost of the micro-step it computes
        self.epoch = 0  # moves on when the cell is lost: its switch and micro-step under way no longer land


def simulate(workload: Workload, policy: PolicyConfig, until_step: int | None = None) -> SimResult:
    """Run the workload under ``policy``; deterministic for a workload's seed; ``until_step``: stop after that
    many steps (a trial on the run's first steps, with the same executions).

    Multi-turn tasks (``turns > 0``): an execution is ``turns`` calls, each decoding ``tokens_per_call`` tokens at
    the speed of a serving cell's batch then waiting for its tools (its drawn duration, spread over the turns);
    it is cut at ``budget_s``. The batch is the calls decoding now spread over the serving cells (the router
    balances them); a call's speed is set when it starts.

    ``onestep`` (one-step off-policy) trains a step only once all its executions finished; every other mode
    streams each execution's data to the trainers as it finishes. With ``carry_over`` a step trains the first
    ``batch_executions / group_size`` groups to finish; the rest run on into later steps.

    Every event of one instant lands before the policy decides on it. A policy that moves the cells more than four
    times each in one instant (with free switches, a bounce that never ends) stops the run with ``RuntimeError``.
    """
    cl, tk, dr = workload.cluster, workload.tasks, workload.drift
    times = executions(workload)
    costs = training_costs(workload, times)
    batch = tk.batch_executions
    steps = min(until_step or tk.steps, tk.steps)
    books = Books(batch, tk.burst_steps, steps)  # the live loop keeps the same books
    cells = [_Cell(f"cell{i}", False) for i in range(cl.cells)]
    cells += [_Cell(f"server{i}", True) for i in range(cl.standalone)]
    by_name = {c.name: c for c in cells}
    losable = cells[1:]  # the core is never lost
    events: list[tuple[float, int, str, object]] = []
    order = itertools.count()
    timeline: list[Segment] = []
    now = 0.0
    applying = False
    done: dict[int, int] = {}  # step -> executions trained (a micro-step computed, or nothing to compute)
    switches = 0
    instant = (0.0, 0)  # (when, moves then): with free switches a policy that bounces cells would never stop
    step_end: list[float] = []
    idle = available = 0.0
    idle_parts = {"serving": 0.0, "training": 0.0, "switching": 0.0}
    lags: list[int] = []
    decoding = 0  # calls decoding now (multi-turn)
    started_at: dict[int, float] = {}
    turns_done: dict[int, int] = {}
    ready_costs: dict[int, deque[float]] = {}  # step -> micro-step costs of its finished executions not taken
    finished_in_step: dict[int, int] = {}
    work_pending = 0  # events that are not outages
    requeued = 0
    whole_steps = policy.mode == "onestep"
    group = tk.group_size
    group_left: dict[int, int] = {}
    began: dict[int, float] = {}  # execution -> when it was dispatched
    ended: dict[int, float] = {}
    trains_in: dict[int, int] = {}

    def start_call(i: int) -> None:
        nonlocal decoding
        decoding += 1
        batch_per_cell = decoding / max(sum(1 for c in cells if c.role == "serving"), 1)
        step_s = cl.decode_step_s * (1 + cl.decode_step_growth * max(batch_per_cell - 1, 0))
        push(now + tk.tokens_per_call * step_s, "decoded", i)

    def push(at: float, kind: str, what: object) -> None:
        nonlocal work_pending
        work_pending += kind not in ("lost", "back")
        heapq.heappush(events, (at, next(order), kind, what))

    def set_role(cell: _Cell, role: Role) -> None:
        timeline.append(Segment(cell.name, cell.role, cell.since, now))
        cell.role, cell.since = role, now

    def observation() -> Observation:
        return books.observation(tuple(CellView(name=c.name, role=c.role, capacity=cl.capacity,
                                                standalone=c.standalone) for c in cells),
                                 max_staleness=policy.max_staleness)  # fmt: skip

    def start_training() -> None:
        nonlocal applying
        step = books.train_step
        if not applying and done.get(step, 0) == batch:  # (every group scored alike: whole at once)
            applying = True
            push(now + cl.apply_s, "applied", step)
        if applying or (whole_steps and finished_in_step.get(step, 0) < batch):
            return
        for cell in cells:
            if cell.role == "training" and cell.busy is None and books.ready.get(step, 0) > 0:
                books.take()
                cell.busy = ready_costs[step].popleft()
                push(now + cell.busy, "micro", (cell.name, cell.epoch))

    def finish(i: int) -> None:
        ended[i] = now
        if not policy.carry_over:
            books.finish(i, ready=False)
            land(i // batch, [i])
            return
        books.finish(i, ready=False)
        first = i - i % group
        group_left[first] = group_left.get(first, group) - 1
        if not group_left[first]:
            land(books.land(first, group), range(first, first + group))

    def land(step: int, executions: Iterable[int]) -> None:
        for j in executions:
            finished_in_step[step] = finished_in_step.get(step, 0) + 1
            trains_in[j] = step
            if costs[j]:
                ready_costs.setdefault(step, deque()).append(costs[j])
                books.make_ready(step, 1)
            else:  # nothing to compute (zero advantage): no trainer is called for it
                done[step] = done.get(step, 0) + 1

    def moved() -> None:
        nonlocal switches, instant
        switches += 1
        instant = (now, instant[1] + 1 if instant[0] == now else 1)
        if instant[1] > 4 * len(cells):  # each cell moves at most a few times in one instant
            raise RuntimeError(f"the policy moved cells {instant[1]} times at {now:.0f} s without time passing: it "
                               f"thrashes (roles {[c.role for c in cells]})")  # fmt: skip

    def act() -> None:
        for _ in range(4 * len(cells) + 4):
            actions = decide(policy, observation())
            if not actions:
                return
            for a in actions:
                match a:
                    case ToTrain(cell=name):
                        set_role(by_name[name], "draining")
                        push(now + cl.serve_to_train_s, "switched", (name, "training", by_name[name].epoch))
                        moved()
                    case ToServe(cell=name):
                        set_role(by_name[name], "resuming")
                        push(now + cl.train_to_serve_s, "switched", (name, "serving", by_name[name].epoch))
                        moved()
                    case Dispatch(current=c, next=n):
                        for i in books.dispatch(c + n):
                            began[i] = now
                            if tk.turns:
                                started_at[i], turns_done[i] = now, 0
                                start_call(i)
                            else:
                                push(stretched(dr, now, times[i]), "finish", i)
            if all(isinstance(a, Dispatch) for a in actions):
                return

    def lose(k: int) -> None:
        nonlocal requeued
        for j in range(min(dr.outage_cells, len(losable))):
            cell = losable[(k * dr.outage_cells + j) % len(losable)]
            if cell.role == "gone":
                continue
            if cell.busy is not None:  # its micro-step is computed again elsewhere
                ready_costs[books.train_step].appendleft(cell.busy)
                books.requeue()
                cell.busy = None
                requeued += 1
            cell.epoch += 1
            set_role(cell, "gone")
            push(now + dr.outage_for_s, "back", cell.name)
        push(dr.outage_every_s / 2 + (k + 1) * dr.outage_every_s, "lost", k + 1)

    if dr.outage_every_s and dr.outage_for_s and dr.outage_cells and losable:
        push(dr.outage_every_s / 2, "lost", 0)
    act()
    while not books.done:
        if not work_pending and not any(c.role == "gone" for c in cells):
            raise RuntimeError(f"the simulation stalled at {now:.0f} s: step {books.train_step}, "
                               f"{books.dispatched} dispatched, roles {[c.role for c in cells]}")  # fmt: skip
        at, _, kind, what = heapq.heappop(events)
        work_pending -= kind not in ("lost", "back")
        serving = sum(cl.capacity for c in cells if c.role == "serving")
        parts = (max(serving - (books.dispatched - books.finished), 0) / cl.capacity,
                 sum(1 for c in cells if c.role == "training" and c.busy is None),
                 sum(1 for c in cells if c.role in ("draining", "resuming")))  # fmt: skip
        for name, cells_idle in zip(("serving", "training", "switching"), parts, strict=True):
            idle_parts[name] += (at - now) * cells_idle
        idle += (at - now) * sum(parts)
        available += (at - now) * sum(1 for c in cells if c.role != "gone")
        now = at
        match kind:
            case "finish":
                finish(cast(int, what))
            case "decoded":
                i = cast(int, what)
                decoding -= 1
                turns_done[i] += 1
                push(stretched(dr, now, times[i] / tk.turns), "tools", i)
            case "tools":
                i = cast(int, what)
                if turns_done[i] < tk.turns and now - started_at[i] < tk.budget_s:
                    start_call(i)
                else:
                    finish(i)
            case "switched":
                name, role, epoch = cast(tuple[str, Role, int], what)
                if by_name[name].epoch == epoch:
                    set_role(by_name[name], role)
            case "micro":
                name, epoch = cast(tuple[str, int], what)
                if by_name[name].epoch == epoch:
                    by_name[name].busy = None
                    done[books.train_step] = done.get(books.train_step, 0) + 1
            case "applied":
                lags += books.applied()
                applying = False
                step_end.append(now)
            case "lost":
                lose(cast(int, what))
            case "back":
                set_role(by_name[cast(str, what)], "serving")
        if events and events[0][0] == now:
            continue  # everything that happens at one instant lands before the policy decides on it
        start_training()
        act()
        start_training()
    for cell in cells:
        set_role(cell, cell.role)
    segments = [s for s in timeline if s.end_s > s.start_s]
    token_lags = [trains_in[i] - _mean_version(step_end, began[i], ended[i]) for i in trains_in]
    return SimResult(
        mode=policy.mode, overlap=policy.overlap, total_s=now, step_end_s=step_end,
        idle_fraction=idle / max(available, 1e-9), switches=switches,
        idle_by_role={k: v / max(available, 1e-9) for k, v in idle_parts.items()},
        staleness_mean=sum(lags) / len(lags), staleness_max=max(lags),
        timeline=segments, stints=sum(1 for s in segments if s.role == "training"),
        async_train_cells=policy.async_train_cells if policy.mode in ("async", "onestep") else 0,
        token_lag_mean=sum(token_lags) / len(token_lags),
        carried=sum(1 for i, step in trains_in.items() if step > i // batch), requeued=requeued,
    )  # fmt: skip


def _mean_version(step_end: list[float], start: float, end: float) -> float:
    """The weights' version averaged over ``start .. end`` (version v from the v-th update on)."""
    if end <= start:
        return float(bisect.bisect_right(step_end, start))
    total, at, version = 0.0, start, bisect.bisect_right(step_end, start)
    while version < len(step_end) and step_end[version] < end:
        total += (step_end[version] - at) * version
        at, version = step_end[version], version + 1
    return (total + (end - at) * version) / (end - start)

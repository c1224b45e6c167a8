"""A discrete-event simulation of cells, executions and training steps, driven by the live controller's policy.

Modelled: execution durations drawn once per run (lognormal around a median with a chosen p99/p50 ratio, cut at the
time budget, so long tails pile up there) and shared by every mode, so modes are compared on the same executions;
serving capacity per cell; one micro-step per execution costing ``micro_step_s`` on one training cell; the core's
update plus weight push (``apply_s``); switch costs each way. Not modelled (yet): decode speed as a function of a
cell's batch, multi-turn tool latency, KV hand-over. Executions are not pinned to cells (a leaving cell's calls move,
as the router moves them); the policy never lets the outstanding ones exceed the serving capacity.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from typing import Annotated, cast

import msgspec

from gyre.control.books import Books
from gyre.control.policy import CellView, Dispatch, Observation, PolicyConfig, Role, ToServe, ToTrain, decide

Positive = Annotated[float, msgspec.Meta(gt=0)]


class Cluster(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The cells and what their work costs."""

    cells: Annotated[int, msgspec.Meta(ge=1)] = 4  # cells that serve and train (the core first)
    standalone: Annotated[int, msgspec.Meta(ge=0)] = 0  # cells that only serve
    capacity: Annotated[int, msgspec.Meta(ge=1)] = 16  # executions one serving cell hosts at once
    micro_step_s: Positive = 60.0  # one execution's training data on one cell, forward + backward
    apply_s: Positive = 30.0  # the optimizer update and the weight push after a step
    serve_to_train_s: Annotated[float, msgspec.Meta(ge=0)] = 8.52  # published at 2.4T scale
    train_to_serve_s: Annotated[float, msgspec.Meta(ge=0)] = 3.46
    decode_step_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0  # one decode step at batch 1 (multi-turn tasks)
    decode_step_growth: Annotated[float, msgspec.Meta(ge=0)] = (
        0.0  # a step at batch b: x (1 + growth (b - 1))
    )


class Tasks(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The executions of a run and how long they take."""

    steps: Annotated[int, msgspec.Meta(ge=1)] = 48
    batch_executions: Annotated[int, msgspec.Meta(ge=1)] = 64  # executions per step
    burst_steps: Annotated[int, msgspec.Meta(ge=1)] = 1  # steps dispatched together as one burst
    duration_median_s: Positive = 1800.0
    duration_p99_over_p50: Annotated[float, msgspec.Meta(ge=1.0)] = 10.0  # tail heaviness
    budget_s: Positive = 14400.0  # an execution is cut (and scored partially) at this
    seed: int = 0
    turns: Annotated[int, msgspec.Meta(ge=0)] = 0  # model calls per execution; 0: one opaque duration each
    tokens_per_call: Annotated[int, msgspec.Meta(ge=1)] = 500  # decoded per call (multi-turn)


class Workload(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One simulated cluster and task distribution (a TOML file: ``[cluster]``, ``[tasks]``)."""

    cluster: Cluster = msgspec.field(default_factory=Cluster)
    tasks: Tasks = msgspec.field(default_factory=Tasks)


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
    idle_fraction: float  # of all cells' time: free serving slots, trainers without work, switching
    switches: int
    staleness_mean: float  # versions between the weights that sampled an execution and the step it trains in
    staleness_max: int
    timeline: list[Segment]
    idle_by_role: dict[
        str, float
    ] = {}  # the idle fraction's parts: free serving slots, trainers without work, switching


def durations(tasks: Tasks) -> list[float]:
    """Every execution's duration, in dispatch order (the same for every mode)."""
    rng = random.Random(tasks.seed)
    sigma = math.log(tasks.duration_p99_over_p50) / 2.3263  # p99 of a lognormal is exp(mu + 2.3263 sigma)
    mu = math.log(tasks.duration_median_s)
    return [
        min(rng.lognormvariate(mu, sigma), tasks.budget_s)
        for _ in range(tasks.steps * tasks.batch_executions)
    ]


class _Cell:
    __slots__ = ("busy", "name", "role", "since", "standalone")

    def __init__(self, name: str, standalone: bool) -> None:
        self.name, self.standalone = name, standalone
        self.role: Role = "serving"
        self.since = 0.0
        self.busy = False  # training: computing a micro-step


def simulate(workload: Workload, policy: PolicyConfig) -> SimResult:
    """Run the whole workload under ``policy``; deterministic for a workload's seed.

    Multi-turn tasks (``turns > 0``): an execution is ``turns`` calls, each decoding ``tokens_per_call`` tokens at
    the speed of a serving cell's batch then waiting for its tools (its drawn duration, spread over the turns);
    it is cut at ``budget_s``. The batch is the calls decoding now spread over the serving cells (the router
    balances them); a call's speed is set when it starts.
    """
    cl, tk = workload.cluster, workload.tasks
    times = durations(tk)
    batch = tk.batch_executions
    books = Books(batch, tk.burst_steps, tk.steps)  # the live loop keeps the same books
    cells = [_Cell(f"cell{i}", False) for i in range(cl.cells)]
    cells += [_Cell(f"server{i}", True) for i in range(cl.standalone)]
    by_name = {c.name: c for c in cells}
    events: list[tuple[float, int, str, object]] = []
    order = itertools.count()
    timeline: list[Segment] = []
    now = 0.0
    done, computing, applying = 0, 0, False
    switches = 0
    step_end: list[float] = []
    idle = 0.0
    idle_parts = {"serving": 0.0, "training": 0.0, "switching": 0.0}
    lags: list[int] = []
    decoding = 0  # calls decoding now (multi-turn)
    started_at: dict[int, float] = {}
    turns_done: dict[int, int] = {}

    def start_call(i: int) -> None:
        nonlocal decoding
        decoding += 1
        batch_per_cell = decoding / max(sum(1 for c in cells if c.role == "serving"), 1)
        step_s = cl.decode_step_s * (1 + cl.decode_step_growth * max(batch_per_cell - 1, 0))
        push(now + tk.tokens_per_call * step_s, "decoded", i)

    def push(at: float, kind: str, what: object) -> None:
        heapq.heappush(events, (at, next(order), kind, what))

    def set_role(cell: _Cell, role: Role) -> None:
        timeline.append(Segment(cell.name, cell.role, cell.since, now))
        cell.role, cell.since = role, now

    def observation() -> Observation:
        return books.observation(tuple(CellView(name=c.name, role=c.role, capacity=cl.capacity,
                                                standalone=c.standalone) for c in cells),
                                 max_staleness=policy.max_staleness)  # fmt: skip

    def start_training() -> None:
        nonlocal computing
        for cell in cells:
            if (
                cell.role == "training"
                and not cell.busy
                and books.ready.get(books.train_step, 0) > 0
                and not applying
            ):
                books.take()
                cell.busy, computing = True, computing + 1
                push(now + cl.micro_step_s, "micro", cell.name)

    def act() -> None:
        nonlocal switches
        for _ in range(4 * len(cells) + 4):
            actions = decide(policy, observation())
            if not actions:
                return
            for a in actions:
                match a:
                    case ToTrain(cell=name):
                        set_role(by_name[name], "draining")
                        push(now + cl.serve_to_train_s, "switched", (name, "training"))
                        switches += 1
                    case ToServe(cell=name):
                        set_role(by_name[name], "resuming")
                        push(now + cl.train_to_serve_s, "switched", (name, "serving"))
                        switches += 1
                    case Dispatch(current=c, next=n):
                        for i in books.dispatch(c + n):
                            if tk.turns:
                                started_at[i], turns_done[i] = now, 0
                                start_call(i)
                            else:
                                push(now + times[i], "finish", i)
            if all(isinstance(a, Dispatch) for a in actions):
                return

    act()
    while not books.done:
        if not events:
            raise RuntimeError(f"the simulation stalled at {now:.0f} s: step {books.train_step}, "
                               f"{books.dispatched} dispatched, roles {[c.role for c in cells]}")  # fmt: skip
        at, _, kind, what = heapq.heappop(events)
        serving = sum(cl.capacity for c in cells if c.role == "serving")
        parts = (max(serving - (books.dispatched - books.finished), 0) / cl.capacity,
                 sum(1 for c in cells if c.role == "training" and not c.busy),
                 sum(1 for c in cells if c.role in ("draining", "resuming")))  # fmt: skip
        for name, cells_idle in zip(("serving", "training", "switching"), parts, strict=True):
            idle_parts[name] += (at - now) * cells_idle
        idle += (at - now) * sum(parts)
        now = at
        match kind:
            case "finish":
                books.finish(cast(int, what))
            case "decoded":
                i = cast(int, what)
                decoding -= 1
                turns_done[i] += 1
                push(now + times[i] / tk.turns, "tools", i)
            case "tools":
                i = cast(int, what)
                if turns_done[i] < tk.turns and now - started_at[i] < tk.budget_s:
                    start_call(i)
                else:
                    books.finish(i)
            case "switched":
                name, role = cast(tuple[str, Role], what)
                set_role(by_name[name], role)
            case "micro":
                by_name[str(what)].busy = False
                computing -= 1
                done += 1
                if done == batch:
                    applying = True
                    push(now + cl.apply_s, "applied", books.train_step)
            case "applied":
                lags += books.applied()
                done, applying = 0, False
                step_end.append(now)
        start_training()
        act()
        start_training()
    for cell in cells:
        set_role(cell, cell.role)
    return SimResult(
        mode=policy.mode, overlap=policy.overlap, total_s=now, step_end_s=step_end,
        idle_fraction=idle / (len(cells) * now), switches=switches,
        idle_by_role={k: v / (len(cells) * now) for k, v in idle_parts.items()},
        staleness_mean=sum(lags) / len(lags), staleness_max=max(lags),
        timeline=[s for s in timeline if s.end_s > s.start_s],
    )  # fmt: skip

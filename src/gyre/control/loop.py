"""The live elastic loop: executions dispatched where the policy says, whole groups streamed to the trainer as they
finish, role moves carried out by the controller, until the run's steps are applied.

One decision per event (an execution finished, a switch ended, a step was applied) or tick: the loop builds the
observation from its `Books` and the controller's cells, asks the policy (keeping each decision in ``decisions``),
starts the moves (concurrently; the policy never asks a switching cell to move again) and the executions it was told
to dispatch. What an execution is, and how a group becomes micro-steps, are the caller's (``execute``, ``build``):
the loop knows counts, groups and steps, not agents or sandboxes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator

import msgspec

from gyre.config import ControllerConfig, TrajectoryConfig
from gyre.control.books import Books
from gyre.control.controller import Controller
from gyre.control.policy import CellView, Dispatch, ToServe, ToTrain, decide
from gyre.errors import CoreLost, SwitchFailed, TrainerError
from gyre.protocol import MicroStep, StepMetrics, SwitchRecord
from gyre.train.step import Rollout, build_step_from_config
from gyre.train.trainerclient import TrainerClient

log = logging.getLogger(__name__)
Execute = Callable[[int], Awaitable[Rollout]]  # execution index -> what it produced (its ``group``: the task)
Build = Callable[[list[Rollout], int], list[MicroStep]]  # a whole group, its step -> micro-steps


class DecisionTrace(msgspec.Struct, frozen=True):
    """One decision of a live run: how many books events preceded it, what else it saw, what it answered."""

    events: int  # len(books.events) when it was taken
    cells: tuple[CellView, ...]
    pending: bool
    actions: list[ToTrain | ToServe | Dispatch]


class LoopResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a run of the loop took and did."""

    mode: str
    total_s: float
    steps: list[StepMetrics]
    step_end_s: list[float]  # seconds from the start when each step was applied
    idle_fraction: float  # of all cells' time: free serving slots, trainers without work, switching
    switches: list[SwitchRecord]
    failed_executions: int
    staleness_mean: float
    staleness_max: int
    decisions: list[DecisionTrace]
    events: list[tuple[str, int, int]]
    # each execution's dispatch and finish, seconds from the start, by index (what `gyre sim` replays as a trace)
    spans: list[tuple[float, float]] = []
    push_s: float = 0.0  # the core's seconds spent pushing weights to serving engines (as last asked)


class LoopSample(msgspec.Struct, frozen=True, kw_only=True):
    """The loop at one moment (a line of ``timeline.jsonl``)."""

    at_s: float  # wall clock, time.time()
    in_flight: int  # executions running: the water level
    ready: int  # finished executions of the step trained now whose data no trainer took yet
    serving: int  # cells per role
    training: int
    switching: int
    idle_cells: float  # cells' worth of idle capacity (see ``ElasticLoop``)
    cells: int
    version: int  # steps applied
    sampling: float = 0.0  # cells' worth of serving slots holding an execution
    computing: int = 0  # training cells holding micro-steps
    push_total_s: float = 0.0  # seconds the core has spent pushing weights to engines, since it started


def group_micro_steps(cfg: TrajectoryConfig, batch_executions: int, kl_coef: float = 0.0) -> Build:
    """Micro-steps of one group, weighted as one ``batch_executions``-execution step would weigh them (so groups can
    stream into the trainer before the step's last execution finished); none for a group that scored alike, unless
    the loss has a KL term (``kl_coef``) or ``cfg.skip_zero_advantage`` is off."""

    def build(group: list[Rollout], step: int) -> list[MicroStep]:
        data = build_step_from_config(group, cfg, step, kl_coef=kl_coef)
        scale = data.executions / batch_executions  # build_step weighs the group as if it were the whole step
        return [msgspec.structs.replace(m, weights=[w * scale for w in m.weights]) for m in data.micro_steps]

    return build


def untrained_reason(executions: int, dropped: list[str], alike: int = 0) -> str:
    """Why a step of ``executions`` executions, of which those dropped for the reasons ``dropped`` and ``alike`` in
    groups that scored alike (advantage 0), has no micro-steps: the commonest reasons first, with counts."""
    if alike and alike + len(dropped) == executions:
        whole = "every group" if not dropped else f"{alike} executions' groups"
        also = f"; {len(dropped)} dropped" if dropped else ""
        return f"{whole} scored alike (advantage 0: nothing to learn, nothing computed){also}"
    if not dropped:
        return f"its {executions} executions gave no trainable tokens"
    counts = Counter(why[:200] for why in dropped)
    commonest = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:3]  # ties: alphabetical
    reasons = "; ".join(f"{n}x {why}" for why, n in commonest)
    more = f"; {len(counts) - 3} more" if len(counts) > 3 else ""
    rest = (
        ""
        if len(dropped) == executions
        else f", the other {executions - len(dropped)} gave no trainable tokens"
    )
    return f"{len(dropped)} of {executions} executions dropped ({reasons}{more}){rest}"


def _alike(rollouts: list[Rollout]) -> int:
    """How many of ``rollouts`` are in groups whose members all scored the same (advantage 0)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for r in rollouts:
        groups[r.group].append(r.reward)
    return sum(len(g) for g in groups.values() if max(g) == min(g))


class ElasticLoop:
    """Runs ``books.steps`` steps of ``books.batch`` executions each, in groups of ``group_size``; the books' step 0
    is the core's next step."""

    def __init__(
        self,
        controller: Controller,
        policy: ControllerConfig,
        books: Books,
        group_size: int,
        execute: Execute,
        build: Build,
        tick_s: float = 0.25,
        on_step: Callable[[int, StepMetrics, list[Rollout]], None] | None = None,
    ) -> None:
        if books.batch % group_size:
            raise ValueError(f"batch_executions {books.batch} is not a multiple of group_size {group_size}")
        self.controller, self.policy, self.books = controller, policy, books
        self.group_size, self.execute, self.build, self.tick_s = group_size, execute, build, tick_s
        # called with (books step, metrics, the step's rollouts) as each step is applied
        self.on_step = on_step
        # submits are asked again when unanswered (the core takes each once); [chaos] may lose or repeat them
        self.trainer = TrainerClient(controller.core_address, timeout_s=120, chaos=controller.link.cfg)
        # waits for the steps, one by one
        self._waiter = TrainerClient(controller.core_address, timeout_s=120)
        self._lock = asyncio.Lock()  # one request at a time on the trainer client
        self._moving: dict[str, str] = {}  # cell -> the role it is switching through
        self._groups: dict[tuple[int, str], list[Rollout]] = defaultdict(list)
        # onestep: a step's groups until it is whole
        self._held: dict[int, list[list[Rollout]]] = defaultdict(list)
        self._in_step: dict[int, list[Rollout]] = defaultdict(list)  # step -> the rollouts submitted to it
        self._spans: dict[int, tuple[float, float]] = {}
        self._submitted_in_step: dict[int, int] = defaultdict(int)
        self._micro_in_step: dict[int, int] = defaultdict(int)
        self._dropped: dict[int, list[str]] = defaultdict(
            list
        )  # step -> why each dropped execution was dropped
        self._wake = asyncio.Event()
        self._failed = 0
        self._metrics: list[StepMetrics] = []
        self._step_end: list[float] = []
        self._lags: list[int] = []
        self._idle = 0.0
        self._claims: dict[str, list[int]] = {}  # trainer member -> micro-steps it holds (last asked)
        self._trained: dict[int, list[str]] = defaultdict(list)  # step -> executions trained (so far)
        self._outside = 0  # executions on the serving cells that are not the run's (see ``outside``)
        self._push_total_s = 0.0  # the core's seconds spent pushing weights (last asked)
        self.decisions: list[DecisionTrace] = []

    async def run(self) -> LoopResult:
        """Until every step is applied; then the cells are left where the policy put them."""
        self._started = time.monotonic()
        first_switch = len(self.controller.records)
        stats = await asyncio.to_thread(self.trainer.statistics)
        self._base = stats.step  # the core's step that is the books' step 0
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                watch = tasks.create_task(self._watch_core())
                waiter = tasks.create_task(self._wait_steps())
                last = time.monotonic()
                while not self.books.done:
                    pending = await self._pending()
                    if self.books.done:  # the last step was applied while the trainer was asked
                        break  # no decision after it: the cells stay where the last step left them
                    now = time.monotonic()
                    self._idle += (now - last) * self._idle_cells()
                    last = now
                    self._decide(pending)
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.tick_s):
                            await self._wake.wait()
                await waiter
                watch.cancel()
        # a lost core is one clear error, whatever else failed on the way out
        except ExceptionGroup as failed:
            lost, _ = failed.split(CoreLost)
            if lost is None:
                raise
            raise lost.exceptions[0] from None
        finally:
            self.trainer.close()
        total = time.monotonic() - self._started
        cells = max(len(self.controller.cells), 1)
        return LoopResult(
            mode=self.policy.mode, total_s=total, steps=self._metrics, step_end_s=self._step_end,
            idle_fraction=self._idle / (cells * total), switches=self.controller.records[first_switch:],
            failed_executions=self._failed,
            staleness_mean=sum(self._lags) / max(len(self._lags), 1), staleness_max=max(self._lags, default=0),
            decisions=self.decisions, events=list(self.books.events),
            spans=[self._spans[i] for i in sorted(self._spans)], push_s=self._push_total_s,
        )  # fmt: skip

    # ---- decisions ----------------------------------------------------------------------------------------------
    def _views(self) -> tuple[CellView, ...]:
        return tuple(msgspec.structs.replace(v, role=self._moving[v.name]) if v.name in self._moving else v
                     for v in self.controller.cell_views())  # fmt: skip

    @contextlib.contextmanager
    def outside(self, count: int) -> Iterator[None]:
        """While the body runs, ``count`` executions that are not the run's (a held-out evaluation) share the serving
        cells: they count in the water level, so the policy keeps cells serving for them and dispatches around them."""
        self._outside += count
        self._wake.set()
        try:
            yield
        finally:
            self._outside -= count
            self._wake.set()

    def _decide(self, pending: bool) -> None:
        cells = self._views()
        observed = self.books.observation(cells, pending, self.policy.max_staleness)
        if self._outside:
            observed = msgspec.structs.replace(observed, in_flight=observed.in_flight + self._outside)
        actions = decide(self.policy, observed)
        self.decisions.append(DecisionTrace(len(self.books.events), cells, pending, list(actions)))
        for action in actions:
            match action:
                case ToTrain(cell=name) | ToServe(cell=name):
                    self._moving[name] = "draining" if isinstance(action, ToTrain) else "resuming"
                    self._tasks.create_task(self._move(action))
                case Dispatch(current=c, next=n):
                    for index in self.books.dispatch(c + n):
                        self._tasks.create_task(self._run_execution(index))

    async def _move(self, action: ToTrain | ToServe) -> None:
        try:
            await self.controller.apply([action])
        except SwitchFailed as exc:  # the cell stays where it is (or is gone); the policy plans with that
            log.warning("%s", exc)
        finally:
            self._moving.pop(action.cell, None)
            self._wake.set()

    # ---- executions and data ------------------------------------------------------------------------------------
    async def _run_execution(self, index: int) -> None:
        step = self.books.step_of(index)  # with carry-over, the step it lands in once its group is whole
        began = time.monotonic() - self._started
        try:
            rollout = await self.execute(index)
        except CoreLost:  # nothing can run any more (every shard lost): the run stops, resumable
            raise
        except Exception as exc:  # a failed execution is data: it leaves its group, nothing else stops
            log.warning("execution %d failed: %s", index, exc)
            self._failed += 1
            rollout = Rollout(execution_id=f"x{index}", group=f"failed-{index}", reward=0.0, records=[],
                              dropped=True, why=f"crashed: {exc}")  # fmt: skip
        self._spans[index] = (began, time.monotonic() - self._started)
        self.books.finish(index, ready=False)
        group_key = (step, f"{index // self.group_size}")
        self._groups[group_key].append(rollout)
        if len(self._groups[group_key]) == self.group_size:
            group = self._groups.pop(group_key)
            if self.policy.carry_over:  # the first step not yet full; whoever runs on goes to a later one
                first = index - index % self.group_size
                step = self.books.land(first, self.group_size)
                await self._submit(step, group)
            elif self.policy.mode == "onestep":
                self._held[step].append(
                    group
                )  # one-step off-policy: the step trains once it is sampled whole
                if sum(map(len, self._held[step])) == self.books.batch:
                    for whole in self._held.pop(step):
                        await self._submit(step, whole)
            else:
                await self._submit(step, group)
        self._wake.set()

    async def _submit(self, step: int, group: list[Rollout]) -> None:
        micro = await asyncio.to_thread(self.build, group, step)
        count = len(group)
        if micro:  # taken once a trainer has begun the step (``_pending``); nothing to compute: no trainer
            self.books.make_ready(step, count)
        self._in_step[step] += group
        async with self._lock:
            self._submitted_in_step[step] += count
            self._micro_in_step[step] += len(micro)
            self._trained[step] += [r.execution_id for r in group if not r.dropped]
            self._dropped[step] += [r.why or "dropped" for r in group if r.dropped]
            seal = self._submitted_in_step[step] == self.books.batch
            # the cursor lands in the step's checkpoint: what a resumed driver finds trained
            cursor = {"step": self._base + step, "execution_ids": self._trained.pop(step)} if seal else None
            untrained = ""
            if seal:
                dropped = self._dropped.pop(step)
                if not self._micro_in_step.pop(
                    step
                ):  # the core applies no update; its metrics keep the reason
                    kept = [r for r in self._in_step[step] if not r.dropped]
                    untrained = untrained_reason(self.books.batch, dropped, _alike(kept))
                    log.warning("step %d trains nothing: %s", step, untrained)
            if micro or seal:
                await asyncio.to_thread(
                    self.trainer.submit, self._base + step, micro, seal, cursor, untrained
                )

    async def _watch_core(self) -> None:
        """`CoreLost` once the controller declares the core cell gone (silent for ``cell_timeout_s``) and its trainer
        does not answer either (within ``cell_timeout_s``: a cell whose beats were only late goes on): it held the
        optimizer and the weights, so no step can apply; every wait on it is abandoned at once."""
        while True:
            reason = await self.controller.wait_core_gone()
            if not await asyncio.to_thread(self._core_answers):
                break
            log.warning("the core cell is silent (%s) but its trainer answers: the run goes on", reason)
            await asyncio.sleep(self.policy.cell_timeout_s)
        why = (
            f"the core cell died ({reason}): it holds the optimizer and the weights, "
            + "so this run cannot go on"
        )
        for client in (self.trainer, self._waiter):
            client.abandon(why)
        raise CoreLost(why)

    def _core_answers(self) -> bool:
        """Whether the core trainer answers a statistics request within ``cell_timeout_s`` (blocking)."""
        with TrainerClient(self.controller.core_address, timeout_s=self.policy.cell_timeout_s) as probe:
            try:
                probe.statistics()
            except TrainerError:
                return False
        return True

    async def _wait_steps(self) -> None:
        with self._waiter as waiter:
            for step in range(self.books.steps):
                metrics = await asyncio.to_thread(
                    waiter.wait_step, self._base + step, 7 * 86400.0
                )  # steps of hours-long executions
                self._metrics.append(metrics)
                self._step_end.append(time.monotonic() - self._started)
                self._lags += self.books.applied()
                log.info("step %d applied after %.1f s", step, self._step_end[-1])
                rollouts = self._in_step.pop(step, [])
                if self.on_step is not None:
                    self.on_step(step, metrics, rollouts)
                self._wake.set()

    async def _pending(self) -> bool:
        """Whether the trainer holds micro-steps of the step trained now that nobody claimed; once trainers have
        begun that step, the executions submitted to it count as taken (the step is running)."""
        async with self._lock:
            stats = await asyncio.to_thread(self.trainer.statistics)
        self._claims, self._push_total_s = stats.claims, stats.push_total_s
        current = stats.step == self._base + self.books.train_step
        begun = current and (stats.done > 0 or any(stats.claims.values()))
        if begun and (ready := self.books.ready.get(self.books.train_step, 0)) > 0:
            self.books.take(ready)
        return current and stats.pending > 0

    def sample(self) -> LoopSample:
        """Where the loop stands now (for the timeline; cheap, no I/O)."""
        roles = [v.role for v in self._views()]
        return LoopSample(
            at_s=time.time(), in_flight=self.books.dispatched - self.books.finished + self._outside,
            ready=self.books.ready.get(self.books.train_step, 0), serving=roles.count("serving"),
            training=roles.count("training"), switching=roles.count("draining") + roles.count("resuming"),
            idle_cells=self._idle_cells(), cells=len(roles), version=self.books.version,
            sampling=self._busy_serving(), computing=self._computing(), push_total_s=self._push_total_s,
        )  # fmt: skip

    def _busy_serving(self) -> float:
        """Cells' worth of serving slots holding an execution."""
        capacities = [c.capacity for c in self.controller.ordered() if c.role == "serving"]
        if not capacities:
            return 0.0
        running = self.books.dispatched - self.books.finished + self._outside
        return min(running, sum(capacities)) / (sum(capacities) / len(capacities))

    def _computing(self) -> int:
        """Training cells holding micro-steps."""
        return sum(1 for c in self.controller.ordered() if c.role == "training"
                   and self._claims.get("core" if c.kind == "core" else c.name))  # fmt: skip

    def _idle_cells(self) -> float:
        """Cells' worth of idle capacity now: free serving slots, training cells holding no micro-step, switching."""
        idle = 0.0
        serving = [c for c in self.controller.ordered() if c.role == "serving"]
        running = self.books.dispatched - self.books.finished + self._outside
        free = max(sum(c.capacity for c in serving) - running, 0)
        if serving:
            idle += free / (sum(c.capacity for c in serving) / len(serving))
        for cell in self.controller.ordered():
            if cell.role in ("draining", "resuming"):
                idle += 1
            elif cell.role == "training":
                member = "core" if cell.kind == "core" else cell.name
                idle += 0 if self._claims.get(member) else 1
        return idle

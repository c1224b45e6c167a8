"""The scheduling policy (DESIGN section 4): which cells serve, which train, how many executions to dispatch.

A pure function of what the controller observes: no I/O, no clock, no state of its own. The live controller and the
simulator (`gyre sim`) build the same `Observation` from their cells and executions and carry out the same actions,
so a decision can be replayed from a trace.

Four modes, everything else equal:
- ``elastic``: cells leave serving in order (the core first, then satellites), one at a time, when the outstanding
  executions and those waiting for capacity fit in the serving capacity without the leaving cell (``w + waiting <=
  C_R - C_e``: the same demand that calls a trainer back, so a move is not undone by what it was decided on) and
  there is training data no trainer has claimed; training cells stay for the whole step (its data streams in) and go
  back to serving after it when the next step's data is not ready, satellites first (the last in order first), the
  core last; mid-step only satellites, and only when the serving cells cannot hold the outstanding and waiting
  executions (``w + waiting > C_R``). Executions are dispatched into free serving capacity; with ``overlap`` the next
  burst's executions too, as long as the weights they would be sampled with are at most ``max_staleness`` versions
  older than the step they train in.
- ``colocate``: every cell samples a burst, then every cell trains on it (a barrier per step).
- ``async``: a fixed split, the first ``async_train_cells`` cells always train, the others always serve; sampling
  runs ahead of training by at most ``max_staleness`` versions.
- ``onestep``: one-step off-policy, what most open frameworks ship: the same fixed split, but a step's rollout phase
  starts only when the previous one ended (no execution of the next burst fills capacity the tail frees), and its
  training starts only once all its executions finished (the runner's part: nothing streams), overlapping only the
  next rollout phase.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from gyre.config import (
    ControllerConfig as PolicyConfig,  # the [controller] settings; the policy reads its first four
)
from gyre.protocol import CellRole

Mode = Literal["elastic", "colocate", "async", "onestep"]
Role = CellRole  # draining/resuming: switching


class CellView(msgspec.Struct, frozen=True, kw_only=True):
    """One cell as the policy sees it."""

    name: str
    role: Role
    capacity: Annotated[int, msgspec.Meta(ge=0)]  # executions it hosts while serving
    standalone: bool = False  # serves only, never trains


class Observation(msgspec.Struct, frozen=True, kw_only=True):
    """What the policy decides on. ``cells`` are in order: the core first, then satellites, then standalone servers."""

    cells: tuple[CellView, ...]
    in_flight: int  # executions dispatched and not finished (all bursts): the water level
    undispatched: int  # executions of the current burst not dispatched yet
    undispatched_step: int  # the step the first of them trains in
    next_burst: int  # executions of the next burst that could be dispatched (overlap)
    data_ready: (
        bool  # training data of the step to train now that no trainer has claimed yet (a step streams)
    )
    step_running: bool  # a step is under way on the training cells
    version: int  # the weights serving cells sample with
    next_burst_step: int  # the step the next burst's executions will train in


class ToTrain(msgspec.Struct, frozen=True, tag="to_train"):
    """Move a serving cell to training (drain, release its engine memory, join the step)."""

    cell: str


class ToServe(msgspec.Struct, frozen=True, tag="to_serve"):
    """Move a training cell back to serving (leave the step, resume memory, take the new weights)."""

    cell: str


class Dispatch(msgspec.Struct, frozen=True, tag="dispatch"):
    """Start ``current`` executions of the current burst and ``next`` of the next one."""

    current: int
    next: int = 0


Action = ToTrain | ToServe | Dispatch


def decide(cfg: PolicyConfig, obs: Observation) -> list[Action]:
    """The actions to take now (role moves first, then at most one dispatch)."""
    moves = MOVES[cfg.mode](cfg, obs)
    serving_after = _serving_capacity(obs, moves)
    return [*moves, *_dispatch(cfg, obs, serving_after, moves)]


def _trainable(obs: Observation) -> list[CellView]:
    return [c for c in obs.cells if not c.standalone and c.role != "gone"]


def _serving_capacity(obs: Observation, moves: list[Action]) -> int:
    leaving = {m.cell for m in moves if isinstance(m, ToTrain)}
    return sum(c.capacity for c in obs.cells if c.role == "serving" and c.name not in leaving)


def _elastic(cfg: PolicyConfig, obs: Observation) -> list[Action]:
    if any(c.role in ("draining", "resuming") for c in obs.cells):
        return []  # moves are serial: one switch at a time
    cells = _trainable(obs)
    serving_capacity = sum(c.capacity for c in obs.cells if c.role == "serving")
    training = [c for c in cells if c.role == "training"]
    # both rules read one demand: a cell leaves only if the demand fits without it, and returns only if it does not
    # fit with the cells serving now, so between the two lies a band of one cell's capacity (the hysteresis) and
    # the move it makes is not undone until the demand itself moves (a finished execution, an update)
    demand = obs.in_flight + _waiting(cfg, obs)
    short = demand > serving_capacity
    between_steps = not obs.step_running
    if training and (short or (between_steps and not obs.data_ready)):
        satellites = [c for c in training if c is not cells[0]]
        if satellites:  # the last in order first; mid-step only when capacity is short
            return [ToServe(satellites[-1].name)]
        if between_steps:  # the core leaves only between steps
            return [ToServe(training[0].name)]
        return []
    if not obs.data_ready:
        return []
    candidate = next((c for c in cells if c.role == "serving"), None)
    if candidate is None or any(c.role == "serving" for c in cells[: cells.index(candidate)]):
        return []
    if demand <= serving_capacity - candidate.capacity:  # the demand leaves room without it
        return [ToTrain(candidate.name)]
    return []


def _waiting(cfg: PolicyConfig, obs: Observation) -> int:
    """Executions that wait for serving capacity: only those the staleness bound lets start (the others wait for an
    update, and a trainer called back for them would leave training short and serve nobody)."""
    return _admissible(cfg, obs) + (obs.next_burst if cfg.overlap and _fresh(cfg, obs) else 0)


def _colocate(cfg: PolicyConfig, obs: Observation) -> list[Action]:
    cells = _trainable(obs)
    train = obs.step_running or (obs.data_ready and obs.in_flight == 0)  # the burst is sampled
    if train:
        return [ToTrain(c.name) for c in cells if c.role == "serving"]
    return [ToServe(c.name) for c in cells if c.role == "training"]


def _async(cfg: PolicyConfig, obs: Observation) -> list[Action]:
    cells = _trainable(obs)
    trainers = {c.name for c in cells[: cfg.async_train_cells]}
    moves: list[Action] = [ToTrain(c.name) for c in cells if c.name in trainers and c.role == "serving"]
    return moves + [ToServe(c.name) for c in cells if c.name not in trainers and c.role == "training"]


MOVES = {
    "elastic": _elastic,
    "colocate": _colocate,
    "async": _async,
    "onestep": _async,
}  # onestep: async's split


def _dispatch(
    cfg: PolicyConfig, obs: Observation, serving_capacity: int, moves: list[Action]
) -> list[Action]:
    free = max(serving_capacity - obs.in_flight, 0)
    if cfg.mode == "colocate" and (obs.step_running or any(c.role == "training" for c in obs.cells) or
                                   any(isinstance(m, ToTrain) for m in moves)):  # fmt: skip
        return []  # the barrier: nothing is sampled while the cells train
    current = min(_admissible(cfg, obs), free)
    free -= current
    fresh = _fresh(cfg, obs)
    overlap = cfg.mode == "async" or (cfg.mode == "elastic" and cfg.overlap)
    later = min(obs.next_burst, free) if overlap and fresh and obs.undispatched == current else 0
    return [Dispatch(current, later)] if current or later else []


def _admissible(cfg: PolicyConfig, obs: Observation) -> int:
    """The current burst's undispatched executions, if the weights serving now may sample them (staleness)."""
    return obs.undispatched if obs.undispatched_step - obs.version <= cfg.max_staleness else 0


def _fresh(cfg: PolicyConfig, obs: Observation) -> bool:
    """The next burst's executions would train at most ``max_staleness`` versions after the weights sampling them."""
    return obs.next_burst_step - obs.version <= cfg.max_staleness

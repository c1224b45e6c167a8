"""The core cell over several ranks (``trainer.ranks = N``): ZeRO-1 state, every rank computing, one coordinator.

Rank 0 is the core trainer process (``gyre.train.coretrainer``: the members' and the driver's ZeroMQ endpoint, the queue,
every decision); it starts ranks 1..N-1 as processes of its own (``start_cell``; they die with it) on the same
machine (a cell is one node: 8 GPUs of it on a cluster). All N ranks form one torch.distributed group (gloo on CPU,
NCCL on GPUs) and hold a ``CellState``: a whole model replica to compute on, and 1/N of the fp32 master weights,
the float64 gradient sum and the AdamW moments (``gyre.train.sharded.ShardedState``). No rank holds the whole
optimizer state or the whole sum.

Rank 0 tells the others what to do over ZeroMQ (``Op``, one PUSH socket per rank, sent in the order rank 0 issues
the matching collectives, so every rank calls the same collective next); they answer with ``Event``\\ s:
- ``Round``: the core's own compute, in rounds of up to N micro-steps (one per rank; ``None`` where a rank has
  none): each rank computes its micro-step on its replica and adds its gradient to its local sum (float64 unless
  ``trainer.gradient_accumulation`` says otherwise), and the round's statistics are all-gathered;
- ``Apply``: the step's one gradient reduction (every rank's local sum into the owners' sums, a ring over gloo:
  ``gyre.train.sharded``), the global norm, clipping, AdamW on every shard, the updated weights all-gathered into
  every replica;
- ``Save``: a checkpoint, each rank writing its range (``torch.distributed.checkpoint``) over a second group, so
  a save does not interleave with a round's collectives;
- a member's pair groups: a satellite has one pair group with each rank (``OpenPair``), and rank r sends it the
  weights of its range (``SendWeights``) and receives the slice of its gradient sum that rank r owns
  (``ReceiveSum``), bucket by bucket. A slice is staged until rank 0 has heard every rank has its slice
  (``Staged``), then added everywhere (``Commit``) or nowhere (``Drop``: the member was lost first and the
  micro-steps go back to the queue), so a sum is counted whole or not at all.

Two threads on every other rank: the op thread takes rank 0's ops as they come, runs a member's pair ops at once
(``OpenPair``, ``SendWeights``, ``ReceiveSum`` and ``ClosePair`` only hand a transfer to that member's pair thread)
and says ``Alive`` every ``trainer.heartbeat_s``; the work thread runs the cell's own ops (``Round``, ``Apply``,
``Save``, ``Commit``, ``Drop``) in the order they came. So a satellite's pair set-up, weights and sum are served
while a round of minutes runs, and the ops whose order matters keep it: a ``Commit`` lands before the ``Apply``
rank 0 sent after it, and a weight send waits for every ``Apply`` that came before it (so a member gets the step's
weights, not a range half gathered; rank 0 holds the next update back until every rank has sent them).

A rank that dies or fails takes the cell with it (rank 0 stops: the driver sees the core lost and resumes from the
last checkpoint), as a one-process core's death does; so does one silent for ``trainer.member_timeout_s`` (stopped,
or its op thread stuck), which rank 0 kills with the others, so that no collective waits for it; rank 0's death
kills the others (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import torch
import torch.distributed as dist
import zmq

from gyre.config import TrainerConfig
from gyre.control.forkserver import Process, spawn
from gyre.control.silence import credit, silent
from gyre.engine.launcher import free_port
from gyre.errors import ConfigError, TrainerError
from gyre.protocol import MicroStats, MicroStep
from gyre.train import checkpoint, recompute
from gyre.train.pairs import Pair, broadcast_range, rank_device
from gyre.train.sharded import ShardedState
from gyre.train.state import flatten_parameters, load_model, lr_at

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 300.0  # the other ranks load the model and join the group within this
COLLECTIVE_TIMEOUT_S = 3600.0


# ---- rank 0 -> rank r ---------------------------------------------------------------------------------------------
class Round(msgspec.Struct, tag="round", kw_only=True):
    micro: MicroStep | None  # this rank's micro-step of the round (None: it only joins the reduce-scatter)
    version: int
    context: bool = False  # every rank has the same micro-step and computes its share of the tokens


class Apply(msgspec.Struct, tag="apply", kw_only=True):
    lr: float


class Save(msgspec.Struct, tag="save", kw_only=True):
    path: str


class OpenPair(msgspec.Struct, tag="open_pair", kw_only=True):
    member: str
    name: str
    host: str  # where the member reaches it (the core's group_host: the cell is one machine)
    port: int


class SendWeights(msgspec.Struct, tag="send_weights", kw_only=True):
    member: str
    name: str


class ReceiveSum(msgspec.Struct, tag="receive_sum", kw_only=True):
    member: str
    name: str
    key: int


class Commit(msgspec.Struct, tag="commit", kw_only=True):
    key: int


class Drop(msgspec.Struct, tag="drop", kw_only=True):
    key: int


class ClosePair(msgspec.Struct, tag="close_pair", kw_only=True):
    member: str
    name: str


class Stop(msgspec.Struct, tag="stop", kw_only=True):
    pass


Op = Round | Apply | Save | OpenPair | SendWeights | ReceiveSum | Commit | Drop | ClosePair | Stop


# ---- rank r -> rank 0 ---------------------------------------------------------------------------------------------
class Ready(msgspec.Struct, tag="ready", kw_only=True):
    rank: int
    ops: str  # where it takes its ops (a PULL socket)
    statistics: dict[str, int]


class WeightsSent(msgspec.Struct, tag="weights_sent", kw_only=True):
    rank: int
    member: str
    name: str  # the member's pair group name on rank 0 (rank r's is ``NAME/r``)


class Staged(msgspec.Struct, tag="staged", kw_only=True):
    rank: int
    key: int
    nbytes: int


class PairFailed(msgspec.Struct, tag="pair_failed", kw_only=True):
    rank: int
    member: str
    name: str
    reason: str


class Report(msgspec.Struct, tag="report", kw_only=True):
    rank: int
    statistics: dict[str, int]


class Alive(msgspec.Struct, tag="alive", kw_only=True):
    rank: int  # every trainer.heartbeat_s from the rank's op thread


Event = Ready | WeightsSent | Staged | PairFailed | Report | Alive
_encoder = msgspec.msgpack.Encoder()
_ops = msgspec.msgpack.Decoder(Op)
events_decoder = msgspec.msgpack.Decoder(Event)


def pair_name(name: str, rank: int) -> str:
    """Rank ``rank``'s pair group with a member whose pair group with rank 0 is ``name``."""
    return name if rank == 0 else f"{name}/{rank}"


# ---- every rank's state ---------------------------------------------------------------------------------------------
class CellState:
    """One rank's part of the core cell's training state (collective: every rank constructs it at once): its model
    replica and ``ShardedState``; on rank 0 also the step, version and what checkpoints carry. Rank 0 passes
    ``followers``: ``apply`` and ``save`` then tell the other ranks first (``TrainState``'s interface)."""

    def __init__(self, cfg: TrainerConfig, save_group: Any, followers: Followers | None = None) -> None:
        self.cfg, self.save_group, self.followers = cfg, save_group, followers
        source = cfg.resume_from or cfg.model_path
        if not source:
            raise ConfigError("trainer.model_path is empty: name the Hugging Face model directory to train")
        self.source = Path(source)
        # this rank's GPU over nccl (its replica, shard and transfers), the host over gloo; fp32 either way (a bf16
        # replica beside fp32 masters is not built yet)
        self.device = rank_device(cfg.collective, dist.get_rank())
        self.model = load_model(source).to(self.device)  # before ShardedState flattens it
        if cfg.activation_checkpointing:
            recompute.enable(self.model)
        self.sharded = ShardedState(self.model, cfg)
        self.flat, self.named, self.numel = self.sharded.flat, self.sharded.named, self.sharded.numel
        self.start, self.end = self.sharded.start, self.sharded.end
        self.step = 0
        self.version = 0
        self.data_cursor: dict[str, Any] = {}
        self.last_metrics: dict[str, Any] = {}
        self.reference: Any | None = None
        self.reference_flat: torch.Tensor | None = None
        if cfg.resume_from:
            state = self._load(Path(cfg.resume_from), weights=True)
            self.step, self.version = int(state["step"]), int(state["version"])
            self.data_cursor = dict(state.get("data_cursor") or {})
        elif cfg.optimizer_from:
            self._load(Path(cfg.optimizer_from), weights=False)
        if cfg.loss.kl_coef > 0:
            self.reference = load_model(cfg.model_path or source).to(self.device).eval()
            self.reference_flat = flatten_parameters(self.reference)
            self.reference.requires_grad_(False)

    def _load(self, path: Path, weights: bool) -> dict[str, Any]:
        state = checkpoint.read_state(path)
        if state.get("parameters") != [n for n, _ in self.named]:
            raise ConfigError(f"{path}: its optimizer state is for other parameters than the model's")
        if not (path / checkpoint.OPTIMIZER_DIR).is_dir():
            raise ConfigError(
                f"{path} keeps its optimizer state in one file (an earlier Gyre): resume it once with "
                "trainer.ranks = 1 and save a checkpoint, which a cell of any size loads"
            )
        flat = checkpoint.load_flat_state(path / checkpoint.OPTIMIZER_DIR, self.numel, group=dist.group.WORLD)
        self.sharded.load_flat_state(flat, weights)
        return state

    def add_range(self, start: int, values: torch.Tensor) -> None:
        """Add a piece of this rank's range (a member's sum: its slice for this rank)."""
        self.sharded.add_owned(start, values)

    def lr_at(self, step: int) -> float:
        return lr_at(self.cfg, step)

    def apply(self) -> tuple[float, float]:
        """(rank 0) One update on every rank; bumps step and version. Returns (grad norm, lr)."""
        lr = self.lr_at(self.step)
        if self.followers is not None:
            self.followers.broadcast(Apply(lr=lr))
        norm = self.update(lr)
        self.step += 1
        self.version += 1
        return norm, lr

    def update(self, lr: float) -> float:
        """(collective) This rank's part of an update: the step's one gradient reduction, then AdamW."""
        if self.cfg.accumulation != "rounds":
            self.sharded.reduce()
        return self.sharded.apply(lr)

    def skip(self) -> float:
        """(rank 0) A step that trained nothing: no update anywhere (no rank summed anything), the counts move on."""
        lr = self.lr_at(self.step)
        self.step += 1
        self.version += 1
        return lr

    def save(self, directory: str | Path, *, max_shard_bytes: int = checkpoint.MAX_SHARD_BYTES) -> Path:
        """(rank 0) A checkpoint written by every rank: each its range of the optimizer state, rank 0 the weights."""
        if self.followers is not None:
            self.followers.broadcast(Save(path=str(directory)))
        state = {"step": self.step, "version": self.version, "data_cursor": self.data_cursor,
                 "metrics": self.last_metrics, "parameters": [n for n, _ in self.named]}  # fmt: skip
        return self.save_rank(directory, state, max_shard_bytes)

    def save_rank(self, directory: str | Path, state: dict[str, Any], max_shard_bytes: int) -> Path:
        """(collective over the save group) This rank's part of a checkpoint."""
        return checkpoint.save_checkpoint(
            directory, config=self.model.config, source=self.source, tensors=checkpoint.model_tensors(self.model),
            flat=self.sharded.flat_state(), numel=self.numel, state=state, group=self.save_group,
            max_shard_bytes=max_shard_bytes,
        )  # fmt: skip

    def statistics(self) -> dict[str, int]:
        return {**msgspec.to_builtins(self.sharded.statistics()), "pid": os.getpid()}


def compute_round(state: CellState, learner: Any, micro: MicroStep | None, cfg: TrainerConfig,
                  version: int, context: bool = False) -> list[MicroStats | None]:  # fmt: skip
    """(collective) This rank's part of a round: compute ``micro`` (if any) into this rank's local sum (with
    ``trainer.gradient_accumulation = "rounds"``: reduce-scatter the round's gradients into the owners' sums now),
    and return every rank's statistics (None where a rank had no micro-step). With ``context`` every rank has the
    same micro-step and computes its share of its tokens (``gyre.train.context``): the reduction sums the shares."""
    from gyre.train import context as cp
    from gyre.train.objective import pace

    stats: MicroStats | None = None
    if micro is not None:
        if context:
            stats = cp.compute_gradients(learner.model, micro, cfg.loss, version, dist.group.WORLD,
                                         learner.reference)  # fmt: skip
        else:
            stats = learner.compute(micro, cfg.loss, version)
        pace(stats, cfg.modelled_tokens_per_s)
        if cfg.accumulation == "rounds":
            state.sharded.reduce_scatter(learner.gradient())
        else:
            state.sharded.accumulate(learner.gradient())
    elif cfg.accumulation == "rounds":
        state.sharded.reduce_scatter(None)  # (collective: a rank with nothing this round sends zeros)
    everyone: list[Any] = [None] * state.sharded.world
    dist.all_gather_object(everyone, None if stats is None else msgspec.to_builtins(stats))
    return [None if s is None else msgspec.convert(s, MicroStats) for s in everyone]


# ---- rank 0's view of the others ---------------------------------------------------------------------------------
class Followers:
    """Rank 0's handle on ranks 1..N-1: their processes, the sockets its ops go out on, the socket their events
    come in on (``events``, polled by the core's coordinator), and their latest statistics."""

    def __init__(self, cfg: TrainerConfig, host: str) -> None:
        self.cfg, self.host, self.world = cfg, host, cfg.ranks
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.events = self.ctx.socket(zmq.PULL)
        self.events.setsockopt(zmq.LINGER, 0)
        self.events.bind(f"tcp://{host}:*")
        self.store_port = free_port()
        self.procs: dict[int, Process] = {}
        self.last_heard: dict[int, float] = {}  # rank -> monotonic time of its last event
        self._ops: dict[int, zmq.Socket[bytes]] = {}
        self._lock = threading.Lock()  # the coordinator and the compute worker both send ops
        self.reports: dict[int, dict[str, int]] = {}
        events_at = self.events.getsockopt_string(zmq.LAST_ENDPOINT)
        config = msgspec.json.encode(cfg)
        for rank in range(1, self.world):
            command = [sys.executable, "-m", "gyre.train.corecell", "--rank", str(rank), "--host", host,
                       "--store-port", str(self.store_port), "--events", events_at]  # fmt: skip
            proc = spawn(command, stdin=subprocess.PIPE, die_with_parent=True)
            assert proc.stdin is not None
            proc.stdin.write(config)
            proc.stdin.close()
            self.procs[rank] = proc

    def wait_ready(self) -> None:
        """Connect to every rank once it says it is ready (each loaded the model and joined the groups)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(self._ops) < self.world - 1:
            if (dead := self.dead()) is not None:
                raise TrainerError(f"the core cell did not start: {dead}")
            if time.monotonic() > deadline:
                raise TrainerError(f"the core cell's ranks were not ready within {READY_TIMEOUT_S:g} s")
            if not self.events.poll(200):
                continue
            event = events_decoder.decode(self.events.recv())
            if isinstance(event, Ready):
                sock = self.ctx.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 1000)
                sock.connect(event.ops)
                self._ops[event.rank] = sock
                self.reports[event.rank] = event.statistics
            self.heard(event.rank)

    def heard(self, rank: int) -> None:
        """Rank ``rank`` said something (any event; ``Alive`` at least every heartbeat)."""
        self.last_heard[rank] = time.monotonic()

    def send(self, rank: int, op: Any) -> None:
        with self._lock:
            self._ops[rank].send(_encoder.encode(op))

    def broadcast(self, op: Any) -> None:
        """The same op to every other rank, in rank order."""
        with self._lock:
            payload = _encoder.encode(op)
            for rank in range(1, self.world):
                self._ops[rank].send(payload)

    def dead(self) -> str | None:
        """Which rank's process has ended, if one has."""
        for rank, proc in self.procs.items():
            if proc.poll() is not None:
                return f"rank {rank} of the core cell exited ({proc.returncode})"
        return None

    def lost(self, stalled_s: float, timeout_s: float) -> str | None:
        """Why the cell is lost, if it is: a rank's process ended, or a rank was silent past ``timeout_s`` (rank 0
        stood still ``stalled_s`` since its last sweep: not counted against anyone)."""
        if (dead := self.dead()) is not None:
            return dead
        now = time.monotonic()
        for rank, seen in self.last_heard.items():
            self.last_heard[rank] = credit(seen, stalled_s, now)
        quiet = silent(self.last_heard, now, timeout_s)
        if quiet:
            rank, seconds = max(quiet.items(), key=lambda kv: kv[1])
            return f"rank {rank} of the core cell was silent for {seconds:.1f} s (stopped, or stuck)"
        return None

    def kill(self) -> None:
        """SIGKILL every other rank (a lost cell: no collective may wait for a silent one)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()

    def close(self) -> None:
        with self._lock:
            for sock in self._ops.values():
                sock.send(_encoder.encode(Stop()))
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with self._lock:
            for sock in self._ops.values():
                sock.close(0)
            self._ops.clear()
        self.events.close(0)
        self.ctx.term()


def _init_group(cfg: TrainerConfig, host: str, port: int, rank: int) -> Any:
    """Join the cell's group (rank 0 hosts its store) and make the second group checkpoints are saved over."""
    # a round waits in its reduce-scatter for the slowest rank's micro-step (minutes for a long one on a CPU); a rank
    # that dies breaks the collective at once, this bounds only a rank that hangs
    timeout = timedelta(seconds=max(COLLECTIVE_TIMEOUT_S, cfg.transfer_timeout_s))
    store = dist.TCPStore(host, port, cfg.ranks, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
    # the cell's collectives over trainer.collective: gloo on host tensors, nccl on each rank's GPU (one a rank);
    # checkpoints over a second group of the same backend (DCP's DTensors live on the ranks' devices)
    device = rank_device(cfg.collective, rank)
    dist.init_process_group(cfg.collective, store=store, rank=rank, world_size=cfg.ranks, timeout=timeout,
                            device_id=device if device.type == "cuda" else None)  # fmt: skip
    return dist.new_group(backend=cfg.collective, timeout=timeout)


def start_cell(cfg: TrainerConfig, host: str) -> tuple[CellState, Followers]:
    """(rank 0) Start the other ranks, form the cell's groups and load rank 0's part of the state."""
    followers = Followers(cfg, host)
    try:
        save_group = _init_group(cfg, host, followers.store_port, 0)
        state = CellState(cfg, save_group, followers)
        followers.wait_ready()
    except BaseException:
        followers.close()
        raise
    log.info(
        "core cell of %d ranks: rank 0 holds [%d, %d) of %d", cfg.ranks, state.start, state.end, state.numel
    )
    return state, followers


# ---- ranks 1..N-1 ---------------------------------------------------------------------------------------------------
class _Follower:
    """One rank other than 0: runs rank 0's ops in order (``run``)."""

    def __init__(self, cfg: TrainerConfig, rank: int, host: str, store_port: int, events_at: str) -> None:
        from gyre.train.learner import TorchLearner

        self.cfg, self.rank, self.host = cfg, rank, host
        self.state = CellState(cfg, _init_group(cfg, host, store_port, rank))
        self.learner = TorchLearner(self.state.model, self.state.flat)
        self.learner.reference = self.state.reference
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._events = self.ctx.socket(zmq.PUSH)
        self._events.setsockopt(zmq.LINGER, 2000)
        self._events.connect(events_at)
        self._events_lock = threading.Lock()  # pair threads report too
        self.ops = self.ctx.socket(zmq.PULL)
        self.ops.bind(f"tcp://{host}:*")
        self.pairs: dict[str, Pair] = {}
        self.staged: dict[int, torch.Tensor] = {}
        self.dropped: set[int] = set()
        self._staged_lock = threading.Lock()
        self.bucket_bytes = int(cfg.bucket_mib * 2**20)
        self.work: queue.SimpleQueue[Op | None] = queue.SimpleQueue()  # the cell's ops, for the work thread
        self.failure: BaseException | None = None  # what ended the work thread
        self._applies_queued = 0  # Apply ops handed to the work thread (op thread only)
        self._applies_done = 0  # ... and done (under _applied)
        self._applied = threading.Condition()

    def report(self, event: Any) -> None:
        with self._events_lock:
            self._events.send(_encoder.encode(event))

    def run(self) -> None:
        """The op thread (see the module) until ``Stop``, rank 0's end, or the work thread's failure (raised)."""
        parent = os.getppid()
        worker = threading.Thread(target=self._work, name=f"cell-rank-{self.rank}-work", daemon=True)
        worker.start()
        self.report(Ready(rank=self.rank, ops=self.ops.getsockopt_string(zmq.LAST_ENDPOINT),
                          statistics=self.state.statistics()))  # fmt: skip
        beat_ms = max(1, int(self.cfg.heartbeat_s * 1000))
        next_beat = time.monotonic() + self.cfg.heartbeat_s
        try:
            while self.failure is None:
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.cfg.heartbeat_s
                    self.report(Alive(rank=self.rank))
                if not self.ops.poll(beat_ms):
                    # rank 0 is gone (PDEATHSIG covers a kill; this, anything else)
                    if os.getppid() != parent:
                        return
                    continue
                match op := _ops.decode(self.ops.recv()):
                    case OpenPair(member=member, name=name, host=host, port=port):
                        self._open(member, name, host, port)
                    case SendWeights(member=member, name=name):
                        self._send_weights(member, name)
                    case ReceiveSum(member=member, name=name, key=key):
                        self._receive_sum(member, name, key)
                    case ClosePair(member=member, name=name):
                        pair = self.pairs.get(member)
                        if pair is not None and pair.name == pair_name(name, self.rank):
                            del self.pairs[member]
                            pair.dead = True
                            pair.close()
                    case Stop():
                        self.work.put(None)
                        worker.join()  # what rank 0 sent before its Stop (a save) is done
                        break
                    case _:
                        if isinstance(op, Apply):
                            self._applies_queued += 1
                        self.work.put(op)
        finally:
            self.work.put(None)
        if self.failure is not None:
            raise TrainerError(f"rank {self.rank} of the core cell failed") from self.failure

    def _work(self) -> None:
        """The work thread: the cell's own ops, in order (see the module)."""
        try:
            while (op := self.work.get()) is not None:
                match op:
                    case Round(micro=micro, version=version, context=context):
                        compute_round(self.state, self.learner, micro, self.cfg, version, context)
                    case Apply(lr=lr):
                        self.state.update(lr)
                        with self._applied:
                            self._applies_done += 1
                            self._applied.notify_all()
                        self.report(Report(rank=self.rank, statistics=self.state.statistics()))
                    case Save(path=path):
                        self.state.save_rank(path, {}, checkpoint.MAX_SHARD_BYTES)
                    case Commit(key=key):
                        with self._staged_lock:
                            piece = self.staged.pop(key)
                        self.state.add_range(self.state.start, piece)
                    case Drop(key=key):
                        with self._staged_lock:
                            if self.staged.pop(key, None) is None:
                                self.dropped.add(key)  # still on its way: dropped when it lands
        except BaseException as exc:  # a collective failed (a rank died) or this rank cannot compute
            log.exception("rank %d of the core cell failed", self.rank)
            with self._applied:
                self.failure = exc
                self._applied.notify_all()

    def _open(self, member: str, name: str, host: str, port: int) -> None:
        old = self.pairs.pop(member, None)
        if old is not None:
            old.dead = True
            old.close()

        def failed(reason: str) -> None:
            self.report(PairFailed(rank=self.rank, member=member, name=name, reason=reason))

        self.pairs[member] = Pair(pair_name(name, self.rank), host, self.cfg.collective,
                                  self.cfg.transfer_timeout_s, failed, port=port)  # fmt: skip

    def _pair(self, member: str, name: str) -> Pair | None:
        pair = self.pairs.get(member)
        return (
            pair if pair is not None and pair.name == pair_name(name, self.rank) and not pair.dead else None
        )

    def _send_weights(self, member: str, name: str) -> None:
        pair = self._pair(member, name)
        if pair is None:
            return
        weights = self.state.flat[self.state.start : self.state.end]
        updates = self._applies_queued  # the weights of the step after these updates

        def op(group: Any) -> None:
            with self._applied:
                self._applied.wait_for(lambda: self._applies_done >= updates or self.failure is not None)
            if self.failure is not None:
                raise TrainerError(f"rank {self.rank} failed before the step's weights were ready")
            broadcast_range(group, weights, 0, self.bucket_bytes)
            self.report(WeightsSent(rank=self.rank, member=member, name=name))

        pair.submit(op)

    def _receive_sum(self, member: str, name: str, key: int) -> None:
        pair = self._pair(member, name)
        if pair is None:
            return

        def op(group: Any) -> None:
            piece = torch.empty(
                self.state.end - self.state.start, dtype=torch.float64, device=self.state.device
            )
            broadcast_range(group, piece, 1, self.bucket_bytes)
            with self._staged_lock:
                if key in self.dropped:
                    self.dropped.discard(key)
                    return
                self.staged[key] = piece
            self.report(Staged(rank=self.rank, key=key, nbytes=piece.numel() * piece.element_size()))

        pair.submit(op)

    def close(self) -> None:
        for pair in self.pairs.values():
            pair.dead = True
            pair.close()
        self.ops.close(0)
        self._events.close()
        self.ctx.term()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    """A rank of a core cell (started by rank 0; the config comes on stdin as JSON)."""
    parser = argparse.ArgumentParser(prog="python -m gyre.train.corecell")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--store-port", type=int, required=True)
    parser.add_argument("--events", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s cell-rank-{args.rank} %(levelname)s %(message)s"
    )
    cfg = msgspec.json.decode(sys.stdin.buffer.read(), type=TrainerConfig)
    torch.manual_seed(cfg.seed)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    follower = _Follower(cfg, args.rank, args.host, args.store_port, args.events)
    try:
        follower.run()
    finally:
        follower.close()


if __name__ == "__main__":
    main()

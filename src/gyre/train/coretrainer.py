"""The core trainer process: authoritative weights, the only optimizer state, and the step's micro-step queue.

Elastic data parallelism (DESIGN section 4). Weights are frozen during a step. The driver streams a step's
micro-steps in (``SubmitMicroSteps``) and seals it; members claim micro-steps one at a time and compute gradients at
the step's weights; when the step is sealed and every micro-step is done the core applies one AdamW update, bumps the
version, pushes the new weights to attached engines and answers ``StepDone``.

A satellite keeps the gradients it computes in a local float64 sum and says only ``Computed`` per micro-step (the
queue marks it held); when there is nothing more for it to claim in a sealed step the core answers its claim with
``Flush``, and it sends the sum once (``GradientSum``: the micro-steps it covers, then the buffer over the pair
group), also before it leaves. The micro-steps are done when the whole sum has arrived; a member lost before that
(killed, silent, left without sending) gives its held micro-steps back to the queue, to be computed again. So the
gradient bytes into the core per step are one sum per satellite however many micro-steps it computed
(``gradient_bytes_in``), not one gradient per micro-step. The core is a member too (``core_computes``), computing in
its own thread and adding each gradient as it is computed; in a cell the computing is switched on and off with the
cell's role (``set_computing``).

With ``trainer.ranks = N`` the core is a cell of N ranks (``gyre.train.corecell``): this process is rank 0 and
coordinates; each rank holds 1/N of the optimizer state and computes in rounds, and each has its own pair group with
every member, over which the member's weights and sum travel in that rank's range only; a sum is added once every
rank holds its slice (``_staged``), on every rank or on none.

How groups are formed (never rebuilt when membership changes): each member has its own two-rank torch.distributed
group with the core (core rank 0, member rank 1), created once when the member first says ``Hello``, from a TCPStore
the core hosts on a fresh port, and kept while the member stays reachable, across leaving and rejoining. Nothing
is shared between members' groups, so a member joining, leaving or dying never touches anyone else's group, and the
core never waits for a collective of the whole membership. Engines get a two-rank group each the same way
(SGLang's ``/init_weights_update_group``), once, when attached. Each pair group's transfers run in order on one
thread per member (a weight send after ``Refresh``, a sum's receive after ``GradientSum``), in the order the
member announced them on the ZeroMQ channel, so both ends always issue the same collective next.

Transfers never hold the coordinator: a weight send to a member reads the weights without a lock, and the update
waits, in the loop and still answering everyone, until no active member has one under way (``_Member.sending``) and
the engines' pushes of the last update have ended (each within ``transfer_timeout_s``).
A member that stalls mid-transfer (a stopped process keeps its sockets open, so nothing fails) is gone once silent
for ``member_timeout_s``: its claims go back to the queue and its transfer is abandoned (gloo cannot abort a send
under way; its thread ends at ``transfer_timeout_s`` and runs nothing after). Whatever it received is never used:
a gone member's gradients are not taken, and it must say ``Hello`` again, which sends it the weights again.

Threads: the coordinator (this module's loop: the ROUTER socket, every decision, updates), the core's compute worker,
one transfer thread per member, one asyncio thread for engine pushes. Only the coordinator touches sockets it did not
create; the others report back through an inproc PUSH/PULL pair.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import msgspec
import torch
import zmq

from gyre.config import TrainerConfig
from gyre.control.silence import StallClock, credit, silent
from gyre.engine import weight_sync
from gyre.engine.launcher import free_port
from gyre.errors import EngineUnavailable, GyreError
from gyre.protocol import (
    Ack,
    Assign,
    AttachEngine,
    Claim,
    Computed,
    Flush,
    GetStatistics,
    Goodbye,
    GradientSum,
    Heartbeat,
    Hello,
    Idle,
    Leave,
    MicroStats,
    MicroStep,
    PairAddress,
    Ping,
    Refresh,
    Refused,
    ReleaseMember,
    SaveCheckpoint,
    SetEngine,
    Shutdown,
    StepDone,
    StepMetrics,
    SubmitMicroSteps,
    TrainerReply,
    TrainerRequest,
    TrainerStatistics,
    WaitStep,
    Wake,
    Welcome,
)
from gyre.train import corecell
from gyre.train.layout import check_run_layout
from gyre.train.learner import Learner, TorchLearner, make_learner
from gyre.train.objective import merge_stats, pace
from gyre.train.pairs import Pair, broadcast_range
from gyre.train.queue import StepQueue, check_micro_step
from gyre.train.sharded import shard_bounds
from gyre.train.state import TrainState

log = logging.getLogger(__name__)
CORE = "core"
REATTACH_EVERY_S = 1.0  # a detached engine is asked for /health this often
KEEP_SUBMISSIONS_STEPS = 16  # submission ids are remembered this many steps after theirs was applied
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(TrainerRequest)


@dataclass(eq=False)
class _Member:
    name: str
    identity: bytes
    pair: Pair
    state: str = "active"  # active | parked (left, group kept) | gone
    last_seen: float = field(default_factory=time.monotonic)
    version: int = -1  # weights it holds (-1: none)
    leaving: bool = False
    idle: bool = False
    transferring: set[int] = field(default_factory=set)  # micro-steps whose gradient is on its way
    sending: int = 0  # weight sends to it not done yet, one per rank (while it is active, the update waits)
    addresses: list[PairAddress] = field(default_factory=list)  # its pair group with each rank of the cell


@dataclass(eq=False)
class _Sum:
    """A member's gradient sum on its way: one slice per rank of the cell, added once every rank has its slice."""

    member: str
    pair: str  # the member's pair group (on rank 0) it came over
    step: int
    indices: list[int]
    waiting: set[int]  # ranks whose slice has not arrived
    piece: torch.Tensor | None = None  # rank 0's slice, once arrived


class CoreTrainer:
    """The core process's state and loop (``run``); ``address`` is where members and the driver connect."""

    def __init__(self, cfg: TrainerConfig) -> None:
        self.cfg = cfg
        self._stall = StallClock(cfg.heartbeat_s)  # restarted by run()
        torch.manual_seed(cfg.seed)
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        self.followers: corecell.Followers | None = None
        self.state: TrainState | corecell.CellState
        if (
            cfg.ranks > 1
        ):  # the cell's other ranks, each with 1/N of the optimizer state (gyre.train.corecell)
            # refused before any rank starts when it does not fit the model or the machine
            log.info(check_run_layout(cfg, cfg.resume_from or cfg.model_path))
            self.state, self.followers = corecell.start_cell(cfg, self._cell_host(cfg))
        else:
            self.state = TrainState(cfg)
        self.ranges = shard_bounds(self.state.numel, cfg.ranks)  # each rank's range of the flat weights
        self.bucket_bytes = int(cfg.bucket_mib * 2**20)
        self.sums: dict[int, _Sum] = {}  # members' gradient sums on their way, by key
        self._sum_keys = itertools.count()
        self.learner = self._learner()  # what the core's own compute worker computes with
        self.queue = StepQueue()
        self.queue.open(self.state.step)
        self.ctx: zmq.Context[zmq.Socket[bytes]] = (
            zmq.Context()
        )  # its own: closing waits for the last replies
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        bind = cfg.bind[:-2] + ":*" if cfg.bind.endswith(":0") else cfg.bind
        self.router.bind(bind)
        self.address = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        bound = urlparse(self.address.replace("tcp://", "http://")).hostname or ""
        if bound in ("", "0.0.0.0", "::", "*"):  # listening everywhere: members reach us by our name
            bound = socket.gethostbyname(socket.gethostname())
        self.group_host = cfg.group_host or bound
        self._events_at = f"inproc://gyre-core-events-{id(self)}"
        self.events = self.ctx.socket(zmq.PULL)
        self.events.bind(self._events_at)
        # each other rank's statistics, as it last reported them (at start, then after every update)
        self.rank_reports: dict[int, dict[str, int]] = dict(self.followers.reports) if self.followers else {}
        self._local = threading.local()
        self._pushers: list[zmq.Socket[bytes]] = []  # each thread's socket to the coordinator
        self._notify_lock = threading.Lock()
        self._closed = False
        self.members: dict[str, _Member] = {}
        self.future: dict[int, list[MicroStep]] = {}  # micro-steps submitted for steps not open yet
        self.sealed_at: dict[int, dict[str, Any]] = {}  # step -> data cursor, once sealed
        # step -> why it may hold no micro-steps (the driver's), once sealed
        self.untrained: dict[int, str] = {}
        # step -> ids of the submits taken (a repeat is only acknowledged)
        self.submissions: dict[int, set[str]] = {}
        self.repeats: dict[int, int] = {}  # step -> repeated submits acknowledged while it was open
        self.waiters: dict[int, list[bytes]] = {}
        self.metrics: dict[int, StepMetrics] = {}
        # held while weights are read for an engine push, a checkpoint or the compute worker; updates wait. Members'
        # weight sends do not take it: the coordinator holds the update back while one is under way (``sending``)
        self.weights_lock = threading.Lock()
        self.engines: dict[str, tuple[Any, weight_sync.WeightGroup, str]] = {}  # url -> client, group, name
        self.inactive: set[str] = set()  # attached engines that get no pushes now (their cell trains)
        self.detached: dict[str, str] = {}  # url -> why it gets no pushes (its last push missed or failed)
        self._reattaching: set[str] = set()  # detached engines probed until they answer (engine loop only)
        self._engine_locks: dict[str, asyncio.Lock] = {}  # url -> held by its push (one collective at a time)
        self.computing = threading.Event()  # the compute worker claims micro-steps while set
        if cfg.core_computes:
            self.computing.set()
        self._busy = False  # the compute worker holds a micro-step (guarded by queue.lock)
        self._engine_loop = asyncio.new_event_loop()
        threading.Thread(target=self._engine_loop.run_forever, name="engine-push", daemon=True).start()
        self._pushes: list[tuple[str, Any]] = []  # (engine url, future) of the pushes of the last update
        self.push_s: dict[str, float] = {}  # engine url -> seconds of its fastest push
        self.push_total_s = 0.0  # seconds of all pushes, summed over engines
        self._group_names = itertools.count()
        self.gradient_bytes_in = 0  # gradient bytes received from members, all steps (guarded by queue.lock)
        self.context_micro_steps = 0  # computed by all the cell's ranks together, all steps
        self.stopping = False
        self._worker: threading.Thread | None = None

    @staticmethod
    def _cell_host(cfg: TrainerConfig) -> str:
        """Where the cell's ranks meet: the machine's loopback, or its address when members come from elsewhere."""
        host = urlparse(cfg.bind.replace("tcp://", "http://")).hostname or "127.0.0.1"
        return "127.0.0.1" if host in ("127.0.0.1", "localhost", "0.0.0.0", "*", "::") else host

    def _learner(self) -> Learner:
        state = self.state
        if self.cfg.backend == "torch":
            own = TorchLearner(state.model, state.flat)  # computes on the authoritative weights themselves
            own.reference = state.reference
            return own
        cfg = self.cfg
        learner = make_learner(cfg.backend, state.model.config.to_dict(), cfg.tensor_parallel, cfg.pipeline_parallel,
                               cfg.num_threads)  # fmt: skip
        if state.reference_flat is not None:
            learner.load_reference(state.reference_flat)
        return learner

    # ---- the loop ---------------------------------------------------------------------------------------------
    def run(self) -> None:
        """Serve members and the driver until ``Shutdown``."""
        self._worker = threading.Thread(target=self._compute, name="core-compute", daemon=True)
        self._worker.start()
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.events, zmq.POLLIN)
        if self.followers is not None:
            poller.register(self.followers.events, zmq.POLLIN)
        next_beat = time.monotonic()
        self._stall = StallClock(self.cfg.heartbeat_s)
        log.info(
            "core trainer at %s (step %d, version %d)", self.address, self.state.step, self.state.version
        )
        try:
            while not self.stopping:
                ready = dict(poller.poll(timeout=max(1, int(self.cfg.heartbeat_s * 500))))
                if self.router in ready:
                    while self.router.poll(0):
                        identity, payload = self.router.recv_multipart()
                        self._handle(identity, payload)
                if self.events in ready:
                    while self.events.poll(0):
                        self._event(msgspec.msgpack.decode(self.events.recv()))
                if self.followers is not None and self.followers.events in ready:
                    while self.followers.events.poll(0):
                        self._cell_event(corecell.events_decoder.decode(self.followers.events.recv()))
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.cfg.heartbeat_s
                    self._beat()
                if self.queue.complete and not self._sending_weights():  # an empty sealed step too: no update
                    self._finish_step()
        finally:
            self.close()

    def _sending_weights(self) -> bool:
        """An active member receives the step's weights, or an engine the last update's: the update waits (the
        loop answers meanwhile; a push ends by its own deadline, a silent member is gone)."""
        return any(m.sending for m in self.members.values() if m.state == "active") or not all(
            push.done() for _, push in self._pushes
        )

    def close(self) -> None:
        """Stop the worker and threads; close sockets."""
        self.stopping = True
        with self.queue.changed:
            self.queue.changed.notify_all()
        for member in self.members.values():
            member.pair.close()
        if self._worker is not None:
            self._worker.join(timeout=30)  # it finishes the micro-step it computes
        self.learner.close()
        if self.followers is not None:
            self.followers.close()
        self._engine_loop.call_soon_threadsafe(self._engine_loop.stop)
        with self._notify_lock:  # no thread makes or uses its socket after this
            self._closed = True
            for sock in self._pushers:
                sock.close(0)
        self.router.close(linger=2000)  # the last replies (Shutdown's Ack, members' Leave) still go out
        self.events.close(0)
        self.ctx.term()  # returns once they are sent (or the linger ran out)

    def _reply(self, identity: bytes, message: TrainerReply) -> None:
        self.router.send_multipart([identity, _encoder.encode(message)])

    def _notify(self, *event: Any) -> None:
        """From any thread: hand an event to the coordinator (dropped once the core is closing)."""
        with self._notify_lock:
            if self._closed:
                return
            sock = getattr(self._local, "push", None)
            if sock is None:
                sock = self._local.push = self.ctx.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(self._events_at)
                self._pushers.append(sock)
            sock.send(msgspec.msgpack.encode(list(event)))

    # ---- requests -----------------------------------------------------------------------------------------------
    def _handle(self, identity: bytes, payload: bytes) -> None:
        try:
            message = _decoder.decode(payload)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
            self._reply(identity, Refused(reason=f"not a trainer request: {exc}"))
            return
        member = self.members.get(getattr(message, "member", ""))
        if member is not None and member.state != "gone":
            member.last_seen = time.monotonic()
        match message:
            case Heartbeat():
                pass
            case Hello(member=name, group_name=held):
                self._hello(identity, name, held)
            case Claim(member=name, version=version):
                self._claim(identity, name, version)
            case Computed(step=step, index=index, stats=stats):
                if member is not None and member.state != "gone" and step == self.queue.step:
                    self.queue.hold(index, member.name, stats)  # refused: the sum covering it will be too
            case GradientSum():
                self._gradient_sum(message)
            case Goodbye(member=name):
                if member is not None:
                    self._park(member, keep_held=False)  # what it held and did not send is computed again
            case SubmitMicroSteps():
                self._submit(identity, message)
            case WaitStep(step=step):
                if step in self.metrics:
                    self._reply(identity, StepDone(metrics=self.metrics[step]))
                elif step < self.state.step:
                    self._reply(identity, Refused(reason=f"step {step} was applied before this core started"))
                else:
                    self.waiters.setdefault(step, []).append(identity)
            case ReleaseMember(member=name):
                self._release(identity, name)
            case AttachEngine(url=url):
                self._attach(identity, url)
            case SetEngine(url=url, active=active):
                self._set_engine(identity, url, active)
            case SaveCheckpoint(path=path):
                with self.weights_lock:
                    where = self.state.save(path)
                self._reply(identity, Ack(detail=str(where)))
            case GetStatistics():
                self._reply(identity, self.statistics())
            case Shutdown():
                for m in self.members.values():
                    if m.state != "gone":
                        self._reply(m.identity, Leave(final=True))
                self._reply(identity, Ack(detail="shutting down"))
                self.stopping = True

    def _hello(self, identity: bytes, name: str, held: str) -> None:
        if not name or name == CORE:
            self._reply(identity, Refused(reason=f"member name {name!r} is reserved or empty"))
            return
        member = self.members.get(name)
        if member is None or member.state == "gone" or member.pair.dead or member.pair.name != held:
            if member is not None and member.state != "gone":  # the same name from a new process
                self._gone(member, "it said Hello again without its pair group (restarted)")
            group_name = f"gyre-pair-{name}-{next(self._group_names)}"
            pair = Pair(group_name, self.group_host, self.cfg.collective, self.cfg.transfer_timeout_s,
                         functools.partial(self._notify, "pair_failed", name, group_name))  # fmt: skip
            member = self.members[name] = _Member(name, identity, pair)
            member.addresses = self._open_pairs(name, pair)
            if self.state.reference_flat is not None:
                reference = self.state.reference_flat
                pair.submit(lambda group: group.broadcast(reference, src=0))
        else:  # a rejoin: it starts with an empty sum, so what it held and did not send is computed again
            self.queue.release(name, keep=member.transferring)
        member.identity, member.state, member.leaving = identity, "active", False
        member.version, member.last_seen = -1, time.monotonic()  # a rejoin gets the step's weights again
        log.info("member %s joined (step %d, version %d)", name, self.queue.step, self.state.version)
        self._reply(identity, Welcome(
            member=name, group_host=member.pair.host, group_port=member.pair.port, group_name=member.pair.name,
            model_config=self.state.model.config.to_dict(), reference=self.state.reference is not None,
            loss=msgspec.to_builtins(self.cfg.loss), heartbeat_s=self.cfg.heartbeat_s,
            member_timeout_s=self.cfg.member_timeout_s, transfer_timeout_s=self.cfg.transfer_timeout_s,
            backend=self.cfg.collective, numel=self.state.numel, modelled_tokens_per_s=self.cfg.modelled_tokens_per_s,
            pairs=member.addresses, bucket_mib=self.cfg.bucket_mib,
            activation_checkpointing=self.cfg.activation_checkpointing,
        ))  # fmt: skip

    def _open_pairs(self, name: str, pair: Pair) -> list[PairAddress]:
        """The member's pair group with each rank of the cell (rank 0's is ``pair``; the others open theirs)."""
        addresses = []
        for rank, (start, end) in enumerate(self.ranges):
            port = pair.port
            if rank and self.followers is not None:
                port = free_port()
                self.followers.send(
                    rank, corecell.OpenPair(member=name, name=pair.name, host=pair.host, port=port)
                )
            addresses.append(PairAddress(rank=rank, host=pair.host, port=port, name=corecell.pair_name(pair.name, rank),
                                         start=start, end=end))  # fmt: skip
        return addresses

    def _claim(self, identity: bytes, name: str, version: int) -> None:
        member = self.members.get(name)
        if member is None or member.state != "active":
            self._reply(identity, Refused(reason=f"{name} is not an active member: say Hello first"))
            return
        member.identity = identity
        if member.leaving:
            self._park(member)
            self._reply(identity, Leave())
            return
        if version != self.state.version or member.version != self.state.version:
            if not self.queue.has_pending_within(self.cfg.max_tokens_per_rank):
                member.idle = True
                self._reply(identity, Idle())
                return
            member.version = self.state.version
            self._reply(identity, Refresh(step=self.queue.step, version=self.state.version))
            member.sending += len(self.ranges)
            member.pair.submit(self._weights_op(member.name, member.pair.name))
            if self.followers is not None:
                self.followers.broadcast(corecell.SendWeights(member=member.name, name=member.pair.name))
            return
        # a satellite is one rank: a micro-step longer than a rank holds is the core cell's (context parallelism)
        claimed = self.queue.claim(name, self.cfg.max_tokens_per_rank)
        if claimed is None:
            if self.queue.sealed and self.queue.held_by(name):  # nothing more for it in this step: its sum
                member.idle = False
                self._reply(identity, Flush(step=self.queue.step))
                return
            member.idle = True  # (in a step still streaming in it keeps its sum; the seal wakes it)
            self._reply(identity, Idle())
            return
        member.idle = False
        index, micro = claimed
        self._reply(
            identity, Assign(step=self.queue.step, version=self.state.version, index=index, micro=micro)
        )

    def _weights_op(self, name: str, pair: str) -> Callable[[weight_sync.WeightGroup], None]:
        """The send of rank 0's range of the step's weights to a member, in buckets: no lock, the update waits for
        it (see the module)."""
        start, end = self.ranges[0]

        def op(group: weight_sync.WeightGroup) -> None:
            broadcast_range(group, self.state.flat[start:end], 0, self.bucket_bytes)
            self._notify("weights_sent", name, pair)

        return op

    def _gradient_sum(self, message: GradientSum) -> None:
        """A member's local sum of ``message.indices`` follows, each rank's slice over that rank's pair group; they
        are done once every slice is in (``_staged``)."""
        member = self.members.get(message.member)
        if member is None or member.pair.dead:
            return  # nothing can be received from it; its held micro-steps were (or will be) given back
        if message.numel != self.state.numel or message.dtype != "float64":
            why = f"sent a sum of {message.numel} {message.dtype} values for {self.state.numel} float64"
            self._notify("pair_failed", member.name, member.pair.name, why)
            return
        member.transferring.update(message.indices)
        key = next(self._sum_keys)
        self.sums[key] = _Sum(member.name, member.pair.name, message.step, list(message.indices),
                              set(range(len(self.ranges))))  # fmt: skip
        start, end = self.ranges[0]

        def op(group: weight_sync.WeightGroup) -> None:
            piece = torch.empty(end - start, dtype=torch.float64, device=self.state.flat.device)
            broadcast_range(group, piece, 1, self.bucket_bytes)
            entry = self.sums.get(key)
            if entry is not None:
                entry.piece = piece
            self._notify("staged", key, 0, piece.numel() * piece.element_size())

        member.pair.submit(op)
        if self.followers is not None:
            self.followers.broadcast(corecell.ReceiveSum(member=member.name, name=member.pair.name, key=key))

    def _staged(self, key: int, rank: int, nbytes: int) -> None:
        """Rank ``rank`` holds its slice of sum ``key``: once every rank does, the sum is added on every rank (or,
        refused by the queue, on none)."""
        entry = self.sums.get(key)
        if entry is None:
            return  # dropped: its member was lost first
        with self.queue.lock:
            self._count_bytes_in(entry.step, nbytes)
        entry.waiting.discard(rank)
        if entry.waiting:
            return
        del self.sums[key]
        start = self.ranges[0][0]
        piece = entry.piece

        def add() -> None:
            assert piece is not None
            self.state.add_range(start, piece)
            if self.followers is not None:
                self.followers.broadcast(corecell.Commit(key=key))

        member = self.members.get(entry.member)
        taken = False
        if member is not None and member.state != "gone" and member.pair.name == entry.pair:
            with self.queue.lock:
                if entry.step == self.queue.step:
                    taken = self.queue.finish_sum(entry.indices, entry.member, add)
                else:
                    self.queue.discarded += len(entry.indices)
            member.transferring.difference_update(entry.indices)
        if not taken and self.followers is not None:
            self.followers.broadcast(corecell.Drop(key=key))

    def _drop_sums(self, name: str) -> None:
        """A lost member's sums on their way are added nowhere."""
        for key in [k for k, s in self.sums.items() if s.member == name]:
            del self.sums[key]
            if self.followers is not None:
                self.followers.broadcast(corecell.Drop(key=key))

    def _count_bytes_in(self, step: int, size: int) -> None:
        """(holding queue.lock) ``size`` bytes of gradient arrived from a member for ``step`` (on any rank)."""
        self.gradient_bytes_in += size
        if step == self.queue.step:
            self.queue.bytes_in += size

    def _park(self, member: _Member, keep_held: bool = True) -> None:
        """It leaves the step: its claims go back, except gradients on their way and (``keep_held``: it was told
        to leave and sends its sum before its ``Goodbye``) the micro-steps it holds computed."""
        member.state, member.idle = "parked", False
        keep = member.transferring | set(self.queue.held_by(member.name) if keep_held else ())
        self.queue.release(member.name, keep=keep)

    def _release(self, identity: bytes, name: str) -> None:
        member = self.members.get(name)
        if member is None or member.state != "active":
            self._reply(identity, Refused(reason=f"{name} is not an active member"))
            return
        member.leaving = True
        if member.idle:  # not computing: tell it now rather than at its next claim
            self._park(member)
            self._reply(member.identity, Leave())
        self._reply(identity, Ack(detail=f"{name} leaves after the micro-step it holds"))

    def _submit(self, identity: bytes, message: SubmitMicroSteps) -> None:
        step, submission = message.step, message.submission
        if submission and submission in self.submissions.get(step, ()):  # a retry or a duplicate: taken
            if step >= self.queue.step:
                self.repeats[step] = self.repeats.get(step, 0) + 1
            log.info("step %d: submission %s again; taken once", step, submission)
            self._reply(identity, Ack(detail=f"step {step}: submission {submission} was taken already"))
            return
        if step < self.queue.step or (step == self.queue.step and self.queue.sealed):
            self._reply(
                identity, Refused(reason=f"step {step} is sealed or applied (open step: {self.queue.step})")
            )
            return
        vocab = int(self.state.model.config.vocab_size)
        for i, micro in enumerate(message.micro_steps):
            if (problem := check_micro_step(micro, vocab)) is not None:
                self._reply(
                    identity, Refused(reason=f"step {step}, micro-step {i} of this submit: {problem}")
                )
                return
        if submission:
            self.submissions.setdefault(step, set()).add(submission)
        if message.seal:
            self.sealed_at[step] = dict(message.data_cursor or {})
            self.untrained[step] = message.untrained or "no micro-steps were submitted"
        if step == self.queue.step:
            self.queue.add(message.micro_steps, seal=message.seal)
            self._wake_idle()
        else:
            self.future.setdefault(step, []).extend(message.micro_steps)
        self._reply(identity, Ack(detail=f"step {step}: {len(message.micro_steps)} micro-steps"))

    def _wake_idle(self) -> None:
        for member in self.members.values():
            if member.state == "active" and member.idle:
                member.idle = False
                self._reply(member.identity, Wake())

    # ---- events from other threads ------------------------------------------------------------------------------
    def _event(self, event: list[Any]) -> None:
        match event:
            case ["received", name, index]:
                member = self.members.get(name)
                if member is not None:
                    member.transferring.discard(index)
            case ["weights_sent", name, pair]:
                member = self.members.get(name)
                if member is not None and member.pair.name == pair:  # not a send to a pair given up since
                    member.sending = max(member.sending - 1, 0)
            case ["pair_failed", name, pair, reason]:
                member = self.members.get(name)
                if member is not None and member.state != "gone" and member.pair.name == pair:
                    self._gone(member, f"its transfer failed: {reason}")
            case ["staged", key, rank, nbytes]:
                self._staged(key, rank, nbytes)
            case ["requeued"]:
                self._wake_idle()
            case ["reply", identity, kind, text]:
                self._reply(identity, Ack(detail=text) if kind == "ack" else Refused(reason=text))

    def _cell_event(self, event: corecell.Event) -> None:
        """What another rank of the cell reports."""
        assert self.followers is not None
        self.followers.heard(event.rank)
        match event:
            case corecell.WeightsSent(member=name, name=pair):
                self._event(["weights_sent", name, pair])
            case corecell.Staged(key=key, rank=rank, nbytes=nbytes):
                self._staged(key, rank, nbytes)
            case corecell.PairFailed(member=name, name=pair, rank=rank, reason=reason):
                self._event(["pair_failed", name, pair, f"(rank {rank} of the cell) {reason}"])
            case corecell.Report(rank=rank, statistics=statistics):
                self.rank_reports[rank] = statistics

    def _beat(self) -> None:
        stalled = self._stall.stalled()  # this thread stood still that long: nobody could be heard
        cell = self.followers
        if cell is not None and (lost := cell.lost(stalled, self.cfg.member_timeout_s)) is not None:
            log.error("%s: the core cell stops (resume it from its last checkpoint)", lost)
            cell.kill()  # a collective under way with a silent rank ends now, not in an hour
            self.stopping = True
            return
        now = time.monotonic()
        # a parked member stopped its heartbeats (it says Hello to rejoin), unless it was told to leave and its sum
        # has not come yet: silent past the timeout, it is gone and its held micro-steps go back
        heard = [m for m in self.members.values()
                 if m.state != "gone" and not (m.state == "parked" and not self.queue.held_by(m.name))]  # fmt: skip
        for member in heard:
            member.last_seen = credit(member.last_seen, stalled, now)
        quiet = silent({member.name: member.last_seen for member in heard}, now, self.cfg.member_timeout_s)
        for member in heard:
            if member.name in quiet:
                self._gone(member, f"silent for {quiet[member.name]:.1f} s")
            else:
                self._reply(member.identity, Ping())

    def _gone(self, member: _Member, reason: str) -> None:
        back = self.queue.release(member.name)
        log.warning("member %s is gone (%s); %d micro-steps claimed again", member.name, reason, len(back))
        member.state, member.idle = "gone", False
        member.transferring.clear()
        self._drop_sums(member.name)
        if self.followers is not None:
            self.followers.broadcast(corecell.ClosePair(member=member.name, name=member.pair.name))
        member.sending = 0  # abandoned: the update no longer waits for it
        member.pair.dead = True
        member.pair.close()
        if back:
            self._wake_idle()

    # ---- the core's own compute -----------------------------------------------------------------------------------
    def _compute(self) -> None:
        if self.cfg.num_threads:
            torch.set_num_threads(self.cfg.num_threads)
        if self.followers is not None:
            self._compute_rounds(self.followers)
            return
        learner, loss = self.learner, self.cfg.loss
        while not self.stopping:
            with self.queue.changed:
                if not self.computing.is_set() or not self.queue.has_pending():
                    self.queue.changed.wait(timeout=0.5)
                    continue
                claimed = self.queue.claim(CORE)
                step, version = self.queue.step, self.state.version
                self._busy = claimed is not None
            if claimed is None:
                continue
            index, micro = claimed
            try:
                if learner.version != version:  # weights are frozen during a step: load them once per step
                    with self.weights_lock:
                        if learner.weights() is not self.state.flat:
                            learner.weights().copy_(self.state.flat)
                        learner.loaded(version)
                stats = learner.compute(micro, loss, version)
                pace(stats, self.cfg.modelled_tokens_per_s)
                gradient = learner.gradient()
            except Exception:  # submissions are checked; this is a bug or the machine (memory): say so loudly
                log.exception(
                    "the core failed computing micro-step %d of step %d; it is claimed again", index, step
                )
                with self.queue.changed:
                    self.queue.release(CORE)
                    self._busy = False
                    self.queue.changed.notify_all()
                self.stopping = True  # a core that cannot compute must not hold the step hostage silently
                return
            with self.queue.changed:
                if step == self.queue.step:
                    self.queue.finish(
                        index, CORE, stats, functools.partial(self.state.add_range, 0, gradient)
                    )
                self._busy = False
                self.queue.changed.notify_all()
            self._notify("received", CORE, index)

    def _compute_rounds(self, followers: corecell.Followers) -> None:
        """The cell's compute: rounds of up to one micro-step per rank, their gradients reduce-scattered into the
        owners' sums (``gyre.train.corecell.compute_round``), done once the round's collective has ended. A micro-step
        longer than ``trainer.max_tokens_per_rank`` is a round of its own that every rank computes a share of."""
        assert isinstance(self.state, corecell.CellState)
        world, limit = len(self.ranges), self.cfg.max_tokens_per_rank
        waiting: tuple[int, MicroStep] | None = None  # a long one claimed after short ones: the next round
        while not self.stopping:
            with self.queue.changed:
                if waiting is None and (not self.computing.is_set() or not self.queue.has_pending()):
                    self.queue.changed.wait(timeout=0.5)
                    continue
                claims: list[tuple[int, MicroStep]] = [waiting] if waiting is not None else []
                waiting = None
                context = bool(claims) and 0 < limit < len(claims[0][1].input_ids)
                while not context and len(claims) < world and (claimed := self.queue.claim(CORE)) is not None:
                    if 0 < limit < len(claimed[1].input_ids):  # too long for one rank
                        if claims:
                            waiting = claimed
                            break
                        context = True
                    claims.append(claimed)
                step, version = self.queue.step, self.state.version
                self._busy = bool(claims) or waiting is not None
            if not claims:
                continue
            if context:
                log.info("micro-step %d of step %d (%d tokens) computed by the cell's %d ranks together",
                         claims[0][0], step, len(claims[0][1].input_ids), world)  # fmt: skip
                self.context_micro_steps += 1
            try:
                for rank in range(1, world):
                    micro = claims[0 if context else rank][1] if context or rank < len(claims) else None
                    followers.send(rank, corecell.Round(micro=micro, version=version, context=context))
                stats = corecell.compute_round(
                    self.state, self.learner, claims[0][1], self.cfg, version, context
                )
            except Exception:  # a rank died (its collective failed) or this one cannot compute
                log.exception("the core cell failed computing a round of step %d; it stops", step)
                with self.queue.changed:
                    self.queue.release(CORE)
                    self._busy = False
                    self.queue.changed.notify_all()
                self.stopping = True
                return
            if context:  # the shares of one micro-step: its figures are their sums
                stats = [merge_stats([s for s in stats if s is not None])]
            with self.queue.changed:
                for (index, _), micro_stats in zip(claims, stats, strict=False):
                    assert micro_stats is not None
                    taken = self.queue.finish(index, CORE, micro_stats, lambda: None)  # summed by the round
                    assert taken, f"micro-step {index} of step {step} was summed but not held by the core"
                self._busy = waiting is not None
                self.queue.changed.notify_all()
            for index, _ in claims:
                self._notify("received", CORE, index)

    def set_computing(self, on: bool) -> None:
        """Let the core's own worker claim micro-steps, or stop it (returns once the one it holds is summed)."""
        with self.queue.changed:
            if on:
                self.computing.set()
                self.queue.changed.notify_all()
                return
            self.computing.clear()
            while self._busy and not self.stopping:
                self.queue.changed.wait(timeout=0.5)

    # ---- the update ---------------------------------------------------------------------------------------------
    def _finish_step(self) -> None:
        # A push holds the weights until its sender has stopped: up to the group's own deadline when an engine stops
        # taking part mid-push (its cell switching, a loaded machine). Waiting for it here held this loop, so no
        # member or driver was answered that long ("did not answer GetStatistics in 120 s"): the loop comes back.
        if not self.weights_lock.acquire(blocking=False):
            return
        q = self.queue
        step = q.step
        untrained = self.untrained.pop(step, "")
        try:
            if q.items:
                norm, lr = self.state.apply()
            else:  # every execution of the step was dropped, say: the run goes on, the metrics say why
                norm, lr = 0.0, self.state.skip()
                log.warning("step %d trained nothing (%s): no update, version %d has the same weights",
                            step, untrained, self.state.version)  # fmt: skip
        finally:
            self.weights_lock.release()
        for url, push in self._pushes:  # done (see run): the previous version reached every engine
            try:
                push.result()
            except Exception as exc:  # the engine keeps its older version; the controller decides what to do
                log.warning("weight push to %s failed: %s", url, exc)
        self._pushes = []
        self.state.data_cursor = self.sealed_at.pop(step, {})
        metrics = _metrics(step, self.state.version, merge_stats(q.stats), len(q.items), norm, lr, q)
        metrics = msgspec.structs.replace(
            metrics,
            untrained="" if q.items else untrained,
            repeated_submits=self.repeats.pop(step, 0),
            gradient_bytes_in=q.bytes_in,
        )
        for old in [s for s in self.submissions if s <= step - KEEP_SUBMISSIONS_STEPS]:
            del self.submissions[old]
        self.metrics[step] = metrics
        # in the step's checkpoint: a driver that died before journaling them reads them there on resume
        self.state.last_metrics = msgspec.to_builtins(metrics)
        log.info("step %d applied: version %d, loss %.4f, %d tokens, %d micro-steps by %s", step,
                 self.state.version, metrics.loss, metrics.tokens, metrics.micro_steps, dict(q.by_member))  # fmt: skip
        if self.cfg.checkpoint_every_steps and self.state.step % self.cfg.checkpoint_every_steps == 0:
            root = Path(self.cfg.checkpoint_dir or "checkpoints")
            self.state.save(root / f"step-{self.state.step}")
        for url in self.engines.keys() - self.inactive:
            self._pushes.append((url, asyncio.run_coroutine_threadsafe(self._push(url), self._engine_loop)))
        q.open(self.state.step)
        if self.state.step in self.future:
            q.add(self.future.pop(self.state.step), seal=self.state.step in self.sealed_at)
        for identity in self.waiters.pop(step, []):
            self._reply(identity, StepDone(metrics=metrics))
        self._wake_idle()

    # ---- engines ------------------------------------------------------------------------------------------------
    def _attach(self, identity: bytes, url: str) -> None:
        if url in self.engines:
            self._reply(identity, Ack(detail=f"{url} is attached already"))
            return

        async def attach() -> None:
            try:
                await self._connect(url)
            except (GyreError, OSError, RuntimeError) as exc:
                self._notify("reply", identity, "refused", f"could not attach engine {url}: {exc}")
                return
            self._notify("reply", identity, "ack", f"{url} serves version {self.state.version}")

        asyncio.run_coroutine_threadsafe(attach(), self._engine_loop)

    async def _connect(self, url: str) -> None:
        """(engine loop) Join a new weight-transfer group with the engine at ``url`` and push it the current
        weights; raises what went wrong (a failed push also detaches it, see ``_send``)."""
        from gyre.engine.engineclient import EngineClient

        async with self._engine_lock(url):
            if url in self.engines:  # attached meanwhile (the controller, or ``_reattach``)
                return
            client = EngineClient(url, timeout_s=self.cfg.transfer_timeout_s)
            port, name = free_port(), f"gyre-weights-{next(self._group_names)}"
            try:  # the group's own deadline first, then ours
                async with asyncio.timeout(self.cfg.transfer_timeout_s + 5):
                    _, group = await asyncio.gather(
                        client.init_weights_update_group(self.group_host, port, 1, 2, name, self.cfg.collective),
                        asyncio.to_thread(weight_sync.create_group, self.group_host, port, 0, 2, name,
                                          self.cfg.collective, self.cfg.transfer_timeout_s),
                    )  # fmt: skip
            except (GyreError, OSError, RuntimeError, TimeoutError) as exc:
                await client.aclose()
                if isinstance(exc, TimeoutError):
                    raise EngineUnavailable(f"{url} did not join a weight-transfer group in time") from None
                raise
            self.engines[url] = (client, group, name)
            self.detached.pop(url, None)
            await self._send(url)

    def _set_engine(self, identity: bytes, url: str, active: bool) -> None:
        if active:
            self.inactive.discard(url)
            if url not in self.engines:
                self._attach(identity, url)
                return

            async def push() -> None:
                try:
                    await self._push(url)
                except (GyreError, OSError, RuntimeError) as exc:
                    self._notify("reply", identity, "refused", f"weight push to {url} failed: {exc}")
                    return
                self._notify("reply", identity, "ack", f"{url} serves version {self.state.version}")

            asyncio.run_coroutine_threadsafe(push(), self._engine_loop)
            return
        self.inactive.add(url)

        async def settled() -> None:  # a push under way holds the engine's lock until its collective ends
            async with self._engine_lock(url):
                self._notify("reply", identity, "ack", f"{url} gets no pushes")

        asyncio.run_coroutine_threadsafe(settled(), self._engine_loop)

    def _engine_lock(self, url: str) -> asyncio.Lock:
        """(engine loop only) The lock one engine's pushes take turns on."""
        return self._engine_locks.setdefault(url, asyncio.Lock())

    async def _push(self, url: str) -> None:
        """Send the current weights to one engine (it reports the new version once they are in)."""
        async with self._engine_lock(url):
            if url not in self.engines:
                why = self.detached.get(url, "not attached")
                raise EngineUnavailable(f"{url} gets no weights: {why}")
            await self._send(url)

    async def _send(self, url: str) -> None:
        """(holding the engine's lock) The push itself, within ``transfer_timeout_s``. An engine that misses the
        deadline or fails is detached: no later update waits for it, and ``_reattach`` attaches it again once it
        answers. The weights lock is held until the tensors' sender has stopped, so what an engine received is
        always one version (a cut-short push ends in the group's own timeout, the same deadline)."""
        client, group, name = self.engines[url]
        await asyncio.to_thread(self.weights_lock.acquire)
        version = self.state.version
        try:
            named = [(n, p.detach()) for n, p in self.state.named]
            started = time.perf_counter()
            log.info("pushing version %d to %s", version, url)
            try:
                async with asyncio.timeout(self.cfg.transfer_timeout_s):
                    if self.cfg.modelled_push_s:  # the weights arrive at the end of the modelled transfer
                        await asyncio.sleep(self.cfg.modelled_push_s)
                    await weight_sync.push_weights(
                        client, group, named, version, name, flattened=True,
                        bucket_bytes=int(self.cfg.bucket_mib * 2**20),
                    )  # fmt: skip
            except (GyreError, OSError, RuntimeError, TimeoutError) as exc:
                why = (
                    f"the push of version {version} timed out after {self.cfg.transfer_timeout_s:g} s"
                    if isinstance(exc, TimeoutError)
                    else f"the push of version {version} failed: {exc}"
                )
                await self._detach(url, why)
                raise EngineUnavailable(f"{url}: {why}") from None
            took = time.perf_counter() - started
            log.info("pushed version %d to %s in %.2f s", version, url, took)
            self.push_s[url] = min(self.push_s.get(url, took), took)
            self.push_total_s += took
        finally:
            self.weights_lock.release()

    async def _detach(self, url: str, why: str) -> None:
        """(engine loop) Stop pushing to ``url``: it keeps serving the version it has; its group is dropped."""
        entry = self.engines.pop(url, None)
        if entry is None:
            return
        self.detached[url] = why
        log.warning("engine %s detached: %s; it is attached again once it answers", url, why)
        await entry[0].aclose()
        if url not in self._reattaching:
            self._reattaching.add(url)
            asyncio.get_running_loop().create_task(self._reattach(url), name=f"gyre-reattach-{url}")

    async def _reattach(self, url: str) -> None:
        """(engine loop) Probe a detached engine until it answers ``/health``, then attach it again: a new group
        and the current weights. One whose cell trains waits: the controller attaches it when it serves again."""
        from gyre.engine.engineclient import EngineClient

        probe = EngineClient(url, timeout_s=5.0)
        try:
            while url in self.detached and url not in self.engines and not self.stopping:
                await asyncio.sleep(REATTACH_EVERY_S)
                if url in self.inactive or not await probe.health():
                    continue
                try:
                    await self._connect(url)
                except (GyreError, OSError, RuntimeError) as exc:
                    log.warning("engine %s answers but could not be attached again: %s", url, exc)
                    continue
                log.warning("engine %s attached again: serves version %d", url, self.state.version)
        finally:
            self._reattaching.discard(url)
            await probe.aclose()

    def statistics(self) -> TrainerStatistics:
        """The current step, members and claims."""
        q = self.queue
        with q.lock:
            return TrainerStatistics(
                step=q.step, version=self.state.version, members={n: m.state for n, m in self.members.items()},
                claims=q.claims(), pending=sum(1 for i in q.pending if not q.done[i]), done=q.done_count,
                sealed=q.sealed, engines=sorted(self.engines),
                weight_bytes=sum(p.numel() * p.element_size() for _, p in self.state.named),
                push_s=dict(self.push_s), push_total_s=self.push_total_s, detached=dict(self.detached),
                held={m: sorted(h) for m, h in q.held.items() if h}, gradient_bytes_in=self.gradient_bytes_in,
                ranks=self._rank_statistics(), context_micro_steps=self.context_micro_steps,
            )  # fmt: skip

    def _rank_statistics(self) -> list[dict[str, int]]:
        if not isinstance(self.state, corecell.CellState):
            return []
        return [self.state.statistics()] + [self.rank_reports[r] for r in sorted(self.rank_reports)]


def _metrics(
    step: int, version: int, s: MicroStats, micro_steps: int, norm: float, lr: float, q: StepQueue
) -> StepMetrics:
    n, tokens = max(s.policy_tokens, 1), max(s.tokens, 1)
    mean = s.ratio_sum / n if s.policy_tokens else 1.0
    var = max(s.ratio_sq_sum / n - mean * mean, 0.0) if s.policy_tokens else 0.0
    return StepMetrics(
        step=step, version=version, loss=s.loss, tokens=s.tokens, computed_tokens=s.computed_tokens,
        micro_steps=micro_steps, clip_fraction=s.clipped / n, truncated_fraction=s.truncated / n,
        ratio_mean=mean, ratio_std=math.sqrt(var), ratio_min=s.ratio_min if s.policy_tokens else 1.0,
        ratio_max=s.ratio_max if s.policy_tokens else 1.0, entropy=s.entropy_sum / tokens, kl=s.kl_sum / tokens,
        grad_norm=norm, lr=lr, staleness_mean=s.staleness_sum / n, staleness_max=s.staleness_max,
        seconds=time.monotonic() - (q.started_s or time.monotonic()), by_member=dict(q.by_member),
        discarded=q.discarded, reclaimed=q.reclaimed,
    )  # fmt: skip


def run_core(cfg: TrainerConfig, ready: Callable[[str], None] | None = None) -> None:
    """The core trainer process's entry: serve until ``Shutdown``; ``ready(address)`` once it listens."""
    core = CoreTrainer(cfg)
    if ready is not None:
        ready(core.address)
    core.run()

"""A satellite trainer: joins the core's step at any moment, claims micro-steps one at a time, sends their sum.

It needs nothing but the core's address: the model's architecture, the loss settings and the step's weights come
from the core (``Welcome``, then ``Refresh`` over the pair group), so a satellite on another machine needs no files.
It adds each micro-step's gradient to a local float64 sum and says ``Computed``; the sum goes to the core once, when
the core answers a claim with ``Flush`` (nothing more to claim in the step) or before it leaves: one gradient's
transfer per step, not one per micro-step. Float64, as the core sums, so the step's sum does not depend on which
member computed which micro-step (the update equals one process computing the batch). Its loop is sequential (one
micro-step at a time), so the order of its pair-group transfers is the order of its messages; a separate thread sends
heartbeats, also while it computes. Told to leave (``Leave`` from the core, or ``request_leave`` here), it finishes
the micro-step it holds, sends its sum and leaves; the pair group stays, so ``run`` can be called again to rejoin a
later step. A satellite that dies before sending loses its unsent micro-steps only: the core computes them again.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

import msgspec
import torch
import zmq

from gyre.config import LossConfig
from gyre.engine import weight_sync
from gyre.errors import CoreUnreachable
from gyre.protocol import (
    Assign,
    Claim,
    Computed,
    Flush,
    Goodbye,
    GradientSum,
    Heartbeat,
    Hello,
    Idle,
    Leave,
    PairAddress,
    Ping,
    Refresh,
    Refused,
    TrainerReply,
    Wake,
    Welcome,
)
from gyre.train.learner import Learner, make_learner
from gyre.train.objective import pace
from gyre.train.pairs import broadcast_range, rank_device

log = logging.getLogger(__name__)
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(TrainerReply)


class SatelliteSummary(msgspec.Struct, frozen=True, kw_only=True):
    """What one ``Satellite.run`` did."""

    member: str
    micro_steps: int  # micro-steps whose gradient it sent (in its sums)
    tokens: int  # tokens through the forward pass
    join_s: float  # from Hello to the first gradient computed (0 if none)
    compute_s: float
    weights_s: float = 0.0  # the fastest weight transfer from the core, seconds (0: none)
    weights_bytes: int = 0  # ... and its size


class Satellite:
    """One satellite member of the core at ``core`` (``tcp://HOST:PORT``), computing with ``backend`` (torch, or
    megatron over ``tensor_parallel`` x ``pipeline_parallel`` processes: one member however many ranks it has)."""

    def __init__(
        self,
        core: str,
        name: str | None = None,
        num_threads: int = 0,
        backend: str = "torch",
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
    ) -> None:
        self.core = core
        self.name = name or f"sat-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.num_threads = num_threads
        if num_threads:
            torch.set_num_threads(num_threads)
        self.backend = backend
        self.tensor_parallel, self.pipeline_parallel = tensor_parallel, pipeline_parallel
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.learner: Learner | None = None  # built at the first Welcome, from the core's model config
        # one pair group per rank of the core cell, with the range of the flat buffers that rank holds
        self.groups: list[tuple[weight_sync.WeightGroup, PairAddress]] = []
        self.group_name = ""
        self.bucket_bytes = 512 * 2**20
        self.version = -1
        self._leave = threading.Event()
        self.joined = (
            threading.Event()
        )  # set once it holds its pair group in a ``run`` (cleared when it ends)
        self._sock: zmq.Socket[bytes] | None = None
        self._sum: torch.Tensor | None = None  # float64, the gradients of ``_held`` (allocated at the first)
        self._held: list[int] = []  # micro-steps of ``_held_step`` computed and not sent yet
        self._held_step = -1

    def close(self) -> None:
        """Stop the learner's other processes (a Megatron member's tensor-parallel ranks); the satellite is done."""
        if self.learner is not None:
            self.learner.close()
            self.learner = None

    def request_leave(self) -> None:
        """Leave after the micro-step in hand (thread-safe; also what SIGTERM does in ``gyre trainer``)."""
        self._leave.set()

    def run(self) -> SatelliteSummary:
        """Join, compute until told to leave (or the core shuts down), and return what was done."""
        self._leave.clear()
        sock = self._sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(self.core)
        stop_beats = threading.Event()
        started = time.monotonic()
        first_gradient = 0.0
        sent = tokens = 0
        compute_s, weights_s = 0.0, float("inf")
        try:
            self._send(Hello(member=self.name, hostname=socket.gethostname(), pid=os.getpid(),
                             group_name=self.group_name))  # fmt: skip
            welcome = self._expect_welcome()
            threading.Thread(target=self._beat, args=(welcome.heartbeat_s, stop_beats), daemon=True).start()
            loss = msgspec.convert(welcome.loss, LossConfig)
            log.info("%s welcomed after %.3f s", self.name, time.monotonic() - started)
            self._join_group(welcome)
            self.joined.set()
            log.info("%s in its pair group after %.3f s", self.name, time.monotonic() - started)
            self._send(Claim(member=self.name, version=self.version))
            while True:
                message = self._recv(welcome.member_timeout_s * 2)
                match message:
                    case Ping() | Idle():
                        continue
                    case Wake():
                        self._send(Claim(member=self.name, version=self.version))
                    case Flush():
                        sent += self._flush()
                        self._send(Claim(member=self.name, version=self.version))
                    case Refresh(version=version):
                        assert self.groups and self.learner is not None
                        self._drop_sum()  # a new step: a sum of an earlier one was given back already
                        received = time.perf_counter()
                        weights = self.learner.weights()
                        for group, at in self.groups:  # each rank of the cell sends its range
                            broadcast_range(group, weights[at.start : at.end], 0, self.bucket_bytes)
                        self.learner.loaded(version)
                        weights_s = min(weights_s, time.perf_counter() - received)
                        self.version = version
                        log.info(
                            "%s has weights %d after %.3f s", self.name, version, time.monotonic() - started
                        )
                        self._send(Claim(member=self.name, version=self.version))
                    case Assign(step=step, version=version, index=index, micro=micro):
                        assert self.groups and self.learner is not None
                        stats = self.learner.compute(micro, loss, version)
                        pace(stats, welcome.modelled_tokens_per_s)
                        self._accumulate(step, index, self.learner.gradient())
                        self._send(Computed(member=self.name, step=step, index=index, stats=stats))
                        tokens, compute_s = tokens + len(micro.input_ids), compute_s + stats.seconds
                        first_gradient = first_gradient or time.monotonic()
                        if self._leave.is_set():
                            sent += self._flush()
                            self._send(Goodbye(member=self.name))
                            break
                        self._send(Claim(member=self.name, version=self.version))
                    case Leave(final=final):
                        if self._held or self._leave.is_set():
                            sent += 0 if final else self._flush()
                            self._send(Goodbye(member=self.name))
                        break
                    case Refused(reason=reason):
                        raise CoreUnreachable(f"the core refused {self.name}: {reason}")
                    case _:
                        log.warning("satellite %s ignores %s", self.name, type(message).__name__)
        finally:
            self.joined.clear()
            stop_beats.set()
            sock.close()
            self._sock = None
            self._drop_sum()  # unsent: the core gives those micro-steps back (this member left or is gone)
        join_s = first_gradient - started if first_gradient else 0.0
        weights_bytes = self.learner.numel * 4 if self.learner is not None else 0  # float32
        return SatelliteSummary(member=self.name, micro_steps=sent, tokens=tokens, join_s=join_s,
                                compute_s=compute_s, weights_s=0.0 if weights_s == float("inf") else weights_s,
                                weights_bytes=weights_bytes)  # fmt: skip

    def _accumulate(self, step: int, index: int, gradient: torch.Tensor) -> None:
        """Add one micro-step's float32 gradient to the local float64 sum of ``step``."""
        if self._held_step != step:
            self._drop_sum()
            self._held_step = step
        if self._sum is None:
            self._sum = torch.zeros(gradient.numel(), dtype=torch.float64, device=gradient.device)
        if not self._held:
            self._sum.zero_()
        self._sum.add_(gradient)  # computed in float64 (the sum's dtype)
        self._held.append(index)

    def _flush(self) -> int:
        """Send the local sum (``GradientSum``, then to each rank of the cell the slice it owns, over their pair
        group, in buckets); returns the micro-steps it covered (0: it held none)."""
        if not self._held:
            return 0
        assert self._sum is not None and self.groups
        covered = len(self._held)
        self._send(GradientSum(member=self.name, step=self._held_step, indices=list(self._held),
                               numel=self._sum.numel(), dtype="float64"))  # fmt: skip
        for group, at in self.groups:
            broadcast_range(group, self._sum[at.start : at.end], 1, self.bucket_bytes)
        self._held = []
        return covered

    def _drop_sum(self) -> None:
        self._held = []

    def _expect_welcome(self) -> Welcome:
        while True:
            message = self._recv(60.0)
            if isinstance(message, Welcome):
                return message
            if isinstance(message, Refused):
                raise CoreUnreachable(f"the core refused {self.name}: {message.reason}")

    def _join_group(self, welcome: Welcome) -> None:
        if self.learner is None:  # on this machine's GPU where the pair groups are nccl
            device = str(rank_device(welcome.backend, int(os.environ.get("LOCAL_RANK", "0"))))
            self.learner = make_learner(self.backend, welcome.model_config, self.tensor_parallel,
                                        self.pipeline_parallel, self.num_threads,
                                        welcome.activation_checkpointing, device)  # fmt: skip
        if self.learner.numel != welcome.numel:
            raise CoreUnreachable(
                f"{self.name} built a model of {self.learner.numel:,} parameters from the core's config, the core "
                f"trains {welcome.numel:,}: the architectures differ (transformers versions?)"
            )
        self.bucket_bytes = int(welcome.bucket_mib * 2**20)
        if welcome.group_name == self.group_name and self.groups:
            return  # a rejoin over the groups we kept
        addresses = welcome.pairs or [PairAddress(rank=0, host=welcome.group_host, port=welcome.group_port,
                                                  name=welcome.group_name, start=0, end=welcome.numel)]  # fmt: skip
        self.groups = []
        for at in addresses:  # in rank order: each rank of the cell waits for us in its own group
            group = weight_sync.create_group(at.host, at.port, 1, 2, at.name, welcome.backend,
                                             welcome.transfer_timeout_s)  # fmt: skip
            self.groups.append((group, at))
        self.group_name = welcome.group_name
        self.version = -1
        if welcome.reference:  # whole, from rank 0
            reference = torch.empty(welcome.numel, dtype=torch.float32, device=self.learner.weights().device)
            self.groups[0][0].broadcast(reference, src=0)
            self.learner.load_reference(reference)

    def _send(self, message: Any) -> None:
        assert self._sock is not None
        self._sock.send(_encoder.encode(message))

    def _recv(self, timeout_s: float) -> TrainerReply:
        """The next message; a Leave of our own when ``request_leave`` was called (none is being computed here;
        the Leave sends the sum of those computed)."""
        assert self._sock is not None
        deadline = time.monotonic() + timeout_s
        while not self._sock.poll(100):
            if self._leave.is_set():
                return Leave()
            if time.monotonic() > deadline:
                raise CoreUnreachable(f"the core at {self.core} did not answer for {timeout_s:.0f} s")
        return _decoder.decode(self._sock.recv())

    def _beat(self, interval_s: float, stop: threading.Event) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.core)
        try:
            while not stop.wait(interval_s):
                sock.send(_encoder.encode(Heartbeat(member=self.name)))
        finally:
            sock.close()


def run_satellite(
    core: str,
    name: str | None = None,
    num_threads: int = 0,
    backend: str = "torch",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
) -> SatelliteSummary:
    """A satellite process's entry: join the core at ``core`` and compute until told to leave."""
    satellite = Satellite(core, name, num_threads, backend, tensor_parallel, pipeline_parallel)
    try:
        return satellite.run()
    finally:
        satellite.close()

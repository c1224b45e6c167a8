"""``TrainerClient``: what the driver (or a script) uses to feed the core trainer and wait for its updates.

Blocking calls over one ZeroMQ DEALER socket, one request at a time; from an event loop call them through
``asyncio.to_thread``. A request the core does not answer in time leaves its socket behind (a late answer must not
be taken for the next request's); a submit is then asked again, up to ``retries`` times, under the same submission
id, which the core takes once, so a lost answer or a repeated request never trains a micro-step twice. `abandon`
(from any thread) ends a wait under way within `POLL_SLICE_S`: the driver stops waiting for a core that is gone.
``launch_core`` / ``launch_satellite`` start trainer processes (``gyre trainer ...``).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import zmq

from gyre.config import ChaosConfig
from gyre.control.chaos import FaultySubmits
from gyre.control.forkserver import Process, spawn
from gyre.errors import TrainerError
from gyre.protocol import (
    Ack,
    AttachEngine,
    GetStatistics,
    MicroStep,
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
)

log = logging.getLogger(__name__)
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(TrainerReply)
DUPLICATE_LINGER_MS = 5000  # a duplicated submit's extra socket delivers within this, then closes
POLL_SLICE_S = 0.2  # a wait for an answer looks at `abandon` this often


class _Unanswered(TrainerError):
    """The core did not answer in time (the request or its answer may be lost)."""


class TrainerClient:
    """Requests to the core at ``address`` (``tcp://HOST:PORT``); ``chaos``: faults injected on submits."""

    def __init__(
        self, address: str, timeout_s: float = 60.0, retries: int = 4, chaos: ChaosConfig | None = None
    ) -> None:
        self.address, self.timeout_s, self.retries = address, timeout_s, retries
        self.faults = FaultySubmits(chaos or ChaosConfig())
        self.retried = 0  # submits asked again after no answer
        self._abandoned = threading.Event()
        self._why = ""
        self._sock = self._connect()

    def _connect(self) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        return sock

    def __enter__(self) -> TrainerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the socket."""
        self._sock.close(0)

    def abandon(self, why: str) -> None:
        """Make the request under way, and every later one, raise `TrainerError` (``why``) at once (thread-safe)."""
        self._why = why
        self._abandoned.set()

    def _poll(self, wait_s: float) -> bool:
        """Whether an answer arrived within ``wait_s``; `TrainerError` once abandoned."""
        deadline = time.monotonic() + wait_s
        while not self._abandoned.is_set():
            if self._sock.poll(int(max(min(deadline - time.monotonic(), POLL_SLICE_S), 0) * 1000)):
                return True
            if time.monotonic() >= deadline:
                return False
        raise TrainerError(self._why)

    def _ask(self, request: TrainerRequest, timeout_s: float | None = None) -> TrainerReply:
        if self._abandoned.is_set():
            raise TrainerError(self._why)
        payload = _encoder.encode(request)
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        fate = self.faults.fate() if isinstance(request, SubmitMicroSteps) else "deliver"
        if fate == "duplicate":  # a second copy reaches the core over a socket whose answer nobody reads
            extra = self._connect()
            extra.setsockopt(zmq.LINGER, DUPLICATE_LINGER_MS)
            extra.send(payload)
            extra.close()
        if fate != "lose_request":
            self._sock.send(payload)
        if fate == "lose_answer":  # the core acts on it; its answer never arrives
            self._poll(wait_s)
        if fate in ("lose_request", "lose_answer") or not self._poll(wait_s):
            self._sock.close(0)  # a late answer must not be taken for the next request's
            self._sock = self._connect()
            if fate in ("lose_request", "lose_answer"):
                raise _Unanswered(
                    f"[chaos] lost the {'request' if fate == 'lose_request' else 'answer'} of a submit"
                )
            raise _Unanswered(
                f"the core at {self.address} did not answer {type(request).__name__} in {wait_s:g} s"
            )
        reply = _decoder.decode(self._sock.recv())
        if isinstance(reply, Refused):
            raise TrainerError(f"the core refused {type(request).__name__}: {reply.reason}")
        return reply

    def submit(
        self,
        step: int,
        micro_steps: list[MicroStep],
        seal: bool = False,
        data_cursor: dict[str, Any] | None = None,
        untrained: str = "",
    ) -> None:
        """Add micro-steps to ``step`` (streamed: call as data becomes ready); ``seal`` with the last ones
        (``untrained``: why, should the step hold none; it then applies no update and its metrics say why). Asked
        again when unanswered, under one submission id: the core takes it once."""
        request = SubmitMicroSteps(step=step, micro_steps=micro_steps, seal=seal, data_cursor=data_cursor,
                                   untrained=untrained, submission=uuid.uuid4().hex)  # fmt: skip
        for attempt in range(self.retries + 1):
            try:
                self._ask(request)
                return
            except _Unanswered as exc:
                if attempt == self.retries:
                    raise TrainerError(f"{exc}, {self.retries + 1} times; giving up") from None
                self.retried += 1
                log.warning("%s; asking again (submission %s)", exc, request.submission)

    def wait_step(self, step: int, timeout_s: float = 3600.0) -> StepMetrics:
        """Block until ``step`` is applied; its metrics."""
        reply = self._ask(WaitStep(step=step), timeout_s)
        assert isinstance(reply, StepDone)
        return reply.metrics

    def release(self, member: str) -> None:
        """Tell a member to leave after the micro-step it holds."""
        self._ask(ReleaseMember(member=member))

    def attach_engine(self, url: str, timeout_s: float = 120.0) -> str:
        """Push weights to the engine at ``url`` now and after every update."""
        reply = self._ask(AttachEngine(url=url), timeout_s)
        assert isinstance(reply, Ack)
        return reply.detail

    def set_engine(self, url: str, active: bool, timeout_s: float = 120.0) -> str:
        """Bring the engine at ``url`` up to date and push to it after updates (``active``), or stop pushing to it
        (returns once a push under way has ended)."""
        reply = self._ask(SetEngine(url=url, active=active), timeout_s)
        assert isinstance(reply, Ack)
        return reply.detail

    def save_checkpoint(self, path: str | Path) -> Path:
        """A checkpoint of the current weights and optimizer state at ``path``."""
        reply = self._ask(SaveCheckpoint(path=str(Path(path).resolve())), 600.0)
        assert isinstance(reply, Ack)
        return Path(reply.detail)

    def statistics(self) -> TrainerStatistics:
        """The core's current step, members and claims."""
        reply = self._ask(GetStatistics())
        assert isinstance(reply, TrainerStatistics)
        return reply

    def shutdown(self) -> None:
        """Stop the core (members are told to leave)."""
        self._ask(Shutdown())


def _spawn(args: list[str], log: Path | None) -> Process:
    out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
    try:
        command = [sys.executable, "-m", "gyre", "trainer", *args]
        return spawn(command, stdout=out, stderr=subprocess.STDOUT)
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]


def launch_core(
    config: str | Path | None,
    overrides: list[str],
    bind: str,
    log: Path | None = None,
    timeout_s: float = 120.0,
) -> Process:
    """Start ``gyre trainer core`` listening at ``bind`` and wait until it answers."""
    args = ["core", "--bind", bind, *(["--config", str(config)] if config else [])]
    for item in overrides:
        args += ["--set", item]
    proc = _spawn(args, log)
    with TrainerClient(bind, timeout_s=timeout_s) as client:
        try:
            client.statistics()
        except TrainerError:
            proc.kill()
            proc.wait()
            detail = log.read_text()[-2000:] if log is not None and log.exists() else ""
            raise TrainerError(
                f"the core trainer did not start at {bind} within {timeout_s:g} s\n{detail}"
            ) from None
    return proc


def launch_satellite(
    core: str,
    name: str,
    num_threads: int = 0,
    log: Path | None = None,
    backend: str = "torch",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
) -> Process:
    """Start ``gyre trainer satellite`` joining the core at ``core`` (computing with ``backend``)."""
    return _spawn(["satellite", "--core", core, "--name", name, "--threads", str(num_threads), "--backend", backend,
                   "--tensor-parallel", str(tensor_parallel), "--pipeline-parallel", str(pipeline_parallel)],
                  log)  # fmt: skip

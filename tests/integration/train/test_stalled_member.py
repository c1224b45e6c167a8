"""A satellite that stops (SIGSTOP: a frozen VM, a stop of the world) just before it receives the step's weights:
the core keeps answering everyone while it waits, drops the stalled member once it is silent for
``member_timeout_s``, and the step finishes with the update of one process computing the whole batch."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from contextlib import suppress
from pathlib import Path

import pytest
from test_elastic import Cluster, assert_accounted, assert_same_update, reference, wait_for

from gyre.errors import TrainerError
from gyre.protocol import MicroStep, StepMetrics
from gyre.train.trainerclient import TrainerClient
from reference import random_micro_steps, train_step

# also the steady satellite's, which leaves if the core is silent for twice it: 20 s, so a loaded machine cannot
# starve it out; the victim is judged by its own silence, not by this test's clock
MEMBER_TIMEOUT_S = 20.0

# A real satellite process that stops itself (SIGSTOP) the moment it is about to receive the step's weights, and
# touches ``joined`` once it holds its pair group (its first Claim follows at once).
STALLING_SATELLITE = """
import os, signal, sys, threading
from pathlib import Path
from gyre.engine.weight_sync import WeightGroup
from gyre.train.satellite import Satellite

core, name, joined = sys.argv[1:4]
broadcast = WeightGroup.broadcast

def stop_before_the_weights(self, tensor, src=0):
    if src == 0:  # the first tensor from the core: the step's weights (this run has no reference model)
        os.kill(os.getpid(), signal.SIGSTOP)
    broadcast(self, tensor, src)

WeightGroup.broadcast = stop_before_the_weights
satellite = Satellite(core, name, num_threads=1)
threading.Thread(target=lambda: satellite.joined.wait() and Path(joined).touch(), daemon=True).start()
satellite.run()
"""


class Listener:
    """Asks the core for its statistics over and over from a thread; ``longest_s``: the longest it went without an
    answer (each request waits up to 60 s, so a frozen core shows as one long gap, not as an error)."""

    def __init__(self, address: str) -> None:
        self.client = TrainerClient(address, timeout_s=60)
        self.longest_s = 0.0
        self.answers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)

    def _listen(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            with suppress(TrainerError):
                self.client.statistics()
            now = time.monotonic()
            self.longest_s, last = max(self.longest_s, now - last), now
            self.answers += 1

    def __enter__(self) -> Listener:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=90)
        self.client.close()


def stopped(proc: subprocess.Popen[bytes]) -> bool:
    """The process is stopped (state T in /proc)."""
    stat = Path(f"/proc/{proc.pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def one_step(
    c: Cluster, step: int, items: list[MicroStep], stall: bool = False
) -> tuple[StepMetrics, float, int]:
    """Train ``step`` over ``items`` (with ``stall``: a satellite that stops before the step's weights joins
    first); the step's metrics, the core's longest silence meanwhile, and (with ``stall``) how many requests it
    answered from the satellite's stop until it declared it gone."""
    if stall:
        joined = c.tmp / "stalled.joined"
        with open(c.tmp / "stalled.log", "ab") as log:
            c.satellites["stalled"] = subprocess.Popen(
                [sys.executable, "-c", STALLING_SATELLITE, c.address, "stalled", str(joined)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_for("the stalling satellite to join its pair group", joined.exists)
    during = 0
    with Listener(c.address) as listener:
        c.client.submit(step, items, seal=True)
        if stall:
            wait_for("the satellite to stop before the weights", lambda: stopped(c.satellites["stalled"]))
            before = listener.answers
            wait_for(
                "the stalled member to be declared gone", lambda: c.stats().members["stalled"] == "gone", 120
            )
            during = listener.answers - before
        metrics = c.client.wait_step(step, timeout_s=300)
    assert listener.answers > 10
    return metrics, listener.longest_s, during


@pytest.mark.timing
@pytest.mark.slow(reason="a core and two satellite processes, and a member left to time out")
def test_a_satellite_stalled_before_the_weights_is_dropped_and_the_core_keeps_answering(
    tiny_model: Path, tmp_path: Path
) -> None:
    items = random_micro_steps(101, 24)
    with Cluster(tiny_model, tmp_path, core_computes=True, timeout_s=MEMBER_TIMEOUT_S) as c:
        steady = c.start("steady")
        wait_for("the steady satellite", lambda: "steady" in c.stats().members)
        # the same micro-steps without, then with, a stalled member
        calm, calm_silence, _ = one_step(c, 0, items)
        metrics, silence, during = one_step(c, 1, items, stall=True)
        figures = (f"step {metrics.seconds:.1f} s (without the stalled member {calm.seconds:.1f} s), the core's "
                   f"longest silence {silence:.2f} s (without: {calm_silence:.2f} s), {during} answers while "
                   "the member was stalled")  # fmt: skip
        print(figures)
        members = c.stats().members
        assert members["stalled"] == "gone", members
        assert steady.poll() is None, "the steady satellite left: it saw the core as silent"
        assert "steady" in metrics.by_member
        # it answered all along, not once at the end of a wait on the stopped member (the seconds are figures only:
        # a loaded machine stretches them)
        assert during > 10, figures
        assert_accounted(metrics, items)
        got = c.weights_after(tmp_path / "ckpt")
    want = reference(tiny_model, items)
    train_step(want, items)
    assert_same_update(got, want)

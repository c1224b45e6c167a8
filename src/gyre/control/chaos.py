"""Faults injected on purpose into the control plane (``[chaos]``, `gyre.config.ChaosConfig`).

Each side of the controller <-> cell channel sends through a `FaultyLink`, which drops a message, sends it twice or
delays it (so that messages also arrive out of order) at the configured rates. The control plane is built to
survive all three: a cell's Hello and beats carry a sequence number (stale ones are ignored) and its current role
(beats bring a controller whose report was lost up to date), the controller repeats a switch's command until the
cell reports it, and a cell carries out each switch number once, repeating its report when asked again. Off by
default; the chaos suite turns it on under a live `gyre train`.

The driver's submits to the core trainer go through `FaultySubmits`: a submit or its answer is lost (the client asks
again, with the same submission id) or a second copy reaches the core; the core takes each submission id once.

The verifier's sandbox starts go through `FaultyStarts`: a start fails as bubblewrap refusing to start would, decided
per execution and attempt (so the same seed fails the same starts whatever order executions finish in). The verifier
retries; an execution whose every attempt failed is dropped from training, unverified, and counted.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any, Literal

from gyre.config import ChaosConfig


class FaultyLink:
    """One side's sending, through the configured faults."""

    def __init__(self, cfg: ChaosConfig, side: str) -> None:
        self.cfg = cfg
        self._rng = random.Random(f"{cfg.seed}:{side}")
        self.sent = self.dropped = self.duplicated = self.delayed = 0

    @property
    def active(self) -> bool:
        """Whether any fault is configured."""
        cfg = self.cfg
        return bool(cfg.control_drop or cfg.control_duplicate or cfg.control_delay_s)

    def counts(self) -> dict[str, int]:
        """Messages sent through this link, and how many of them were dropped, duplicated and delayed."""
        return {
            "sent": self.sent,
            "dropped": self.dropped,
            "duplicated": self.duplicated,
            "delayed": self.delayed,
        }

    def send(self, deliver: Callable[[], Any]) -> None:
        """Deliver one message (``deliver`` sends it) zero, one or two times, each after its own delay."""
        self.sent += 1
        if not self.active:
            deliver()
            return
        cfg, rng = self.cfg, self._rng
        if rng.random() < cfg.control_drop:
            self.dropped += 1
            return
        copies = 2 if rng.random() < cfg.control_duplicate else 1
        self.duplicated += copies - 1
        for _ in range(copies):
            delay = rng.uniform(0.0, cfg.control_delay_s) if cfg.control_delay_s else 0.0
            if delay > 0:
                self.delayed += 1
                asyncio.get_running_loop().call_later(delay, deliver)
            else:
                deliver()


SubmitFate = Literal["deliver", "lose_request", "lose_answer", "duplicate"]


class FaultySubmits:
    """The fate of each of the driver's ``SubmitMicroSteps`` (`gyre.train.trainerclient.TrainerClient` carries it out)."""

    def __init__(self, cfg: ChaosConfig, side: str = "driver") -> None:
        self.cfg = cfg
        self._rng = random.Random(f"{cfg.seed}:{side}:submits")
        self.sent = self.lost_requests = self.lost_answers = self.duplicated = 0

    @property
    def active(self) -> bool:
        """Whether any fault is configured."""
        return bool(self.cfg.trainer_drop or self.cfg.trainer_duplicate)

    def counts(self) -> dict[str, int]:
        """Submits sent (retries included), and how many were lost on the way there or back, and duplicated."""
        return {"sent": self.sent, "lost_requests": self.lost_requests, "lost_answers": self.lost_answers,
                "duplicated": self.duplicated}  # fmt: skip

    def fate(self) -> SubmitFate:
        """What happens to the next submit."""
        self.sent += 1
        if not self.active:
            return "deliver"
        if self._rng.random() < self.cfg.trainer_drop:
            if self._rng.random() < 0.5:
                self.lost_requests += 1
                return "lose_request"
            self.lost_answers += 1
            return "lose_answer"
        if self._rng.random() < self.cfg.trainer_duplicate:
            self.duplicated += 1
            return "duplicate"
        return "deliver"


class FaultyStarts:
    """Which starts of the verifier's sandbox fail (`gyre.tasks.verify.Verifier`'s ``start_fault``)."""

    def __init__(self, cfg: ChaosConfig) -> None:
        self.cfg = cfg
        self.tried = self.failed = 0

    @property
    def active(self) -> bool:
        """Whether any fault is configured."""
        return bool(self.cfg.verifier_start_fail)

    def counts(self) -> dict[str, int]:
        """Verifier sandbox starts tried, and how many of them were made to fail."""
        return {"verifier_starts": self.tried, "verifier_starts_failed": self.failed}

    def fails(self, key: str, attempt: int) -> bool:
        """Whether attempt ``attempt`` (from 1) of verifying execution ``key`` fails to start its sandbox."""
        self.tried += 1
        failed = (
            random.Random(f"{self.cfg.seed}:verifier:{key}:{attempt}").random() < self.cfg.verifier_start_fail
        )
        self.failed += failed
        return failed

"""A member's two-rank torch.distributed group with the core, and the thread that runs its
transfers: one at a time, in the order they were submitted, which is the order the peer announced them, so both
ends always issue the same collective next (see `gyre.train.coretrainer`)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import torch

from gyre.engine import weight_sync
from gyre.engine.launcher import free_port
from gyre.errors import ConfigError


class Pair:
    """A member's two-rank group with the core, and the thread running its transfers in order."""

    def __init__(
        self,
        name: str,
        host: str,
        backend: str,
        timeout_s: float,
        on_fail: Callable[[str], None],
        port: int | None = None,
    ) -> None:
        self.name, self.host, self.port = name, host, port or free_port()
        self.dead = False
        self._ops: queue.SimpleQueue[Callable[[weight_sync.WeightGroup], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, args=(backend, timeout_s, on_fail), name=f"pair-{name}", daemon=True
        )
        self._thread.start()

    def submit(self, op: Callable[[weight_sync.WeightGroup], None]) -> None:
        """Run ``op(group)`` after every op submitted before it."""
        self._ops.put(op)

    def close(self) -> None:
        """Stop after the ops already submitted (none more once ``dead``: the peer is gone)."""
        self._ops.put(None)

    def _run(self, backend: str, timeout_s: float, on_fail: Callable[[str], None]) -> None:
        try:
            group = weight_sync.create_group(self.host, self.port, 0, 2, self.name, backend, timeout_s)
            while (op := self._ops.get()) is not None and not self.dead:
                op(group)
        except Exception as exc:  # a dead or silent peer: the coordinator declares it gone
            self.dead = True
            on_fail(f"{type(exc).__name__}: {exc}")


def rank_device(collective: str, local_rank: int = 0) -> torch.device:
    """Where a trainer rank keeps its replica, its shard and what it sends over a group of ``collective``: its GPU
    (``cuda:local_rank``, one rank per GPU of the machine) over nccl, the host over gloo."""
    if collective == "nccl":
        if not torch.cuda.is_available():
            raise ConfigError(
                "trainer.collective = 'nccl' needs CUDA GPUs, and torch sees none here; use 'gloo'"
            )
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def broadcast_range(
    group: weight_sync.WeightGroup, buffer: torch.Tensor, src: int, bucket_bytes: int
) -> None:
    """Broadcast a 1-d ``buffer`` over a pair group in pieces of at most ``bucket_bytes`` (both ends call it with
    the same length, dtype and bucket size, so they cut the same pieces): a transfer's staging costs a bucket."""
    step = max(1, bucket_bytes // buffer.element_size())
    for lo in range(0, buffer.numel(), step):
        group.broadcast(buffer[lo : lo + step], src=src)

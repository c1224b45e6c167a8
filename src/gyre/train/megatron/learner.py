"""A Megatron-core member: one model sharded over a tensor-parallel group of processes, driven by rank 0.

Rank 0 lives in the member's own process (the core's, or a satellite's) and is the only rank that talks to the core.
It starts the other ranks as child processes (``python -m gyre.train.megatron.learner``) and tells them what to do
next over their stdin, one `gyre.protocol.ShardCommand` at a time (length-prefixed msgpack); the data moves over the
group's own collectives (gloo on CPU, NCCL on GPUs): the step's weights as one broadcast of the Hugging Face flat
buffer, each rank taking its shard (`gyre.train.megatron.convert`), and gradients as one gather to rank 0, which
converts them back to the exchange layout. A rank whose stdin closes (rank 0 died) exits: nothing is orphaned.

Order: every collective is issued by every rank in the order rank 0 wrote the commands, so the group never deadlocks
on mismatched collectives.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
from typing import IO, Any

import msgspec
import torch
import torch.distributed as dist

from gyre.config import LossConfig
from gyre.engine.launch import free_port
from gyre.errors import ConfigError
from gyre.protocol import MicroStats, MicroStep, ShardCommand, ShardCompute, ShardGather, ShardLoad, ShardStop
from gyre.train.megatron import compat, convert
from gyre.train.megatron.model import build_model, token_logprobs_and_entropy
from gyre.train.objective import compute_gradients

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ShardCommand)


class Shard:
    """This rank's part of the member: its Megatron model (and reference), loading, computing, gathering."""

    def __init__(self, model_config: dict[str, Any], rank: int, size: int) -> None:
        self.rank, self.size = rank, size
        self.arch = convert.Architecture.from_hf(model_config)
        self.arch.check_split(size)
        self.layout = convert.hf_layout(model_config)
        self.numel = sum(_count(shape) for _, shape in self.layout)
        self.model = build_model(self.arch, size)
        self.reference: Any | None = None
        self.staging = torch.empty(self.numel, dtype=torch.float32)  # the Hugging Face flat buffer

    def load(self, reference: bool = False) -> None:
        """``staging`` (broadcast from rank 0) into this rank's shard of the model or of the reference."""
        if self.size > 1:
            dist.broadcast(self.staging, src=0)
        if reference and self.reference is None:
            self.reference = build_model(self.arch, self.size).eval()
            self.reference.requires_grad_(False)
        target = self.reference if reference else self.model
        assert target is not None
        params = dict(target.named_parameters())
        shard = convert.to_megatron(
            convert.unflatten(self.staging, self.layout), self.arch, self.rank, self.size
        )
        if shard.keys() != params.keys():  # the mapping and this megatron-core disagree: say where
            raise ConfigError(
                f"the Hugging Face -> Megatron mapping does not fit megatron-core's model: mapped but absent "
                f"{sorted(shard.keys() - params.keys())}, present but unmapped {sorted(params.keys() - shard.keys())}"
            )
        with torch.no_grad():
            for name, value in shard.items():
                params[name].copy_(value)

    def compute(self, micro: MicroStep, loss: LossConfig, version: int) -> MicroStats:
        return compute_gradients(self.model, micro, loss, version, self.reference, token_logprobs_and_entropy)

    def gather(self) -> torch.Tensor | None:
        """Every rank's gradients to rank 0, there in the exchange layout (other ranks: None); clears them."""
        named = list(self.model.named_parameters())
        local = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for _, p in named]
        )
        self.model.zero_grad(set_to_none=True)
        pieces = [torch.empty_like(local) for _ in range(self.size)] if self.rank == 0 else None
        if self.size > 1:
            dist.gather(local, pieces, dst=0)
        else:
            pieces = [local]
        if pieces is None:
            return None
        shards = []
        for piece in pieces:
            offset, shard = 0, {}
            for name, p in named:
                shard[name] = piece[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
            shards.append(shard)
        return convert.flatten(convert.to_hf(shards, self.arch, gradients=True), self.layout)


class MegatronLearner:
    """Rank 0 of a ``size``-way tensor-parallel Megatron member (a `gyre.train.learner.Learner`)."""

    def __init__(self, model_config: dict[str, Any], size: int = 1, num_threads: int = 0) -> None:
        compat.import_megatron()
        arch = convert.Architecture.from_hf(model_config)
        arch.check_split(size)
        self.version = -1
        self.followers: list[subprocess.Popen[bytes]] = []
        address = f"tcp://127.0.0.1:{free_port()}"
        setup = json.dumps({"config": model_config, "size": size, "address": address, "threads": num_threads})
        for rank in range(1, size):
            self.followers.append(subprocess.Popen(
                [sys.executable, "-m", "gyre.train.megatron.learner", str(rank)],
                stdin=subprocess.PIPE, env={**os.environ, "GYRE_SHARD_SETUP": setup},
            ))  # fmt: skip
        compat.init_parallel(0, size, address)
        self.shard = Shard(model_config, 0, size)
        self.numel = self.shard.numel

    def _tell(self, command: ShardCommand) -> None:
        payload = _encoder.encode(command)
        for follower in self.followers:
            assert follower.stdin is not None
            follower.stdin.write(struct.pack("<I", len(payload)) + payload)
            follower.stdin.flush()

    def weights(self) -> torch.Tensor:
        return self.shard.staging

    def loaded(self, version: int) -> None:
        self._tell(ShardLoad())
        self.shard.load()
        self.version = version

    def load_reference(self, flat: torch.Tensor) -> None:
        self.shard.staging.copy_(flat)
        self._tell(ShardLoad(reference=True))
        self.shard.load(reference=True)

    def compute(self, micro: MicroStep, loss: LossConfig, version: int) -> MicroStats:
        self._tell(ShardCompute(micro=micro, loss=msgspec.to_builtins(loss), version=version))
        return self.shard.compute(micro, loss, version)

    def gradient(self) -> torch.Tensor:
        self._tell(ShardGather())
        flat = self.shard.gather()
        assert flat is not None
        return flat

    def close(self) -> None:
        """Stop the other ranks (they exit after the command they run)."""
        with contextlib.suppress(BrokenPipeError, OSError):  # a rank that died already
            self._tell(ShardStop())
        for follower in self.followers:
            if follower.stdin is not None:
                with contextlib.suppress(OSError):
                    follower.stdin.close()  # a rank that missed the stop reads end-of-file and exits
            try:
                follower.wait(timeout=30)
            except subprocess.TimeoutExpired:
                follower.kill()
                follower.wait()
        self.followers = []


def _read(stream: IO[bytes]) -> ShardCommand | None:
    header = stream.read(4)
    if len(header) < 4:
        return None  # rank 0 is gone
    (n,) = struct.unpack("<I", header)
    return _decoder.decode(stream.read(n))


def follow(rank: int) -> None:
    """A rank > 0: join the group, then run rank 0's commands until told to stop or its stdin closes."""
    setup = json.loads(os.environ["GYRE_SHARD_SETUP"])
    if setup["threads"]:
        torch.set_num_threads(setup["threads"])
    compat.init_parallel(rank, setup["size"], setup["address"])
    shard = Shard(setup["config"], rank, setup["size"])
    while True:
        match _read(sys.stdin.buffer):
            case ShardLoad(reference=reference):
                shard.load(reference)
            case ShardCompute(micro=micro, loss=loss, version=version):
                shard.compute(micro, msgspec.convert(loss, LossConfig), version)
            case ShardGather():
                shard.gather()
            case ShardStop() | None:
                return


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


if __name__ == "__main__":
    follow(int(sys.argv[1]))

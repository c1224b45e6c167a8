"""A Megatron-core member: one model sharded over tensor-parallel ranks and pipeline stages (processes), driven
by rank 0.

Rank 0 lives in the member's own process (the core's, or a satellite's) and is the only rank that talks to the core.
It starts the other ranks as child processes (``python -m gyre.train.megatron.member``) and tells them what to do
next over their stdin, one `gyre.protocol.MegatronCommand` at a time (length-prefixed msgpack); the data moves over the
member's own process group (gloo on CPU, NCCL on GPUs): the step's weights as one broadcast of the Hugging Face flat
buffer, each rank taking its shard (`gyre.train.megatron.convert`); hidden states between pipeline stages point to
point; gradients from every rank to rank 0, which converts them back to the exchange layout. A rank whose stdin
closes (rank 0 died) exits: nothing is orphaned.

Order: every rank issues its collectives and point-to-point transfers in the order rank 0 wrote the commands, and
within a micro-step in an order fixed by the micro-step itself, so the group never waits on a mismatched transfer.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
import subprocess
import sys
from typing import IO, Any

import msgspec
import torch
import torch.distributed as dist

from gyre.config import LossConfig
from gyre.control.forkserver import Process, spawn
from gyre.engine.launcher import free_port
from gyre.errors import ConfigError
from gyre.protocol import (
    MegatronCommand,
    MegatronCompute,
    MegatronGather,
    MegatronLoad,
    MegatronStop,
    MicroStats,
    MicroStep,
)
from gyre.train.megatron import compat, convert
from gyre.train.megatron.gpt import build_model, decode, head, sequences, token_logprobs_and_entropy
from gyre.train.objective import compute_gradients

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(MegatronCommand)
_stats_encoder = msgspec.msgpack.Encoder()
_stats_decoder = msgspec.msgpack.Decoder(MicroStats)


class Shard:
    """This rank's part of the member: its Megatron model (and reference), loading, computing, gathering.

    Rank ``r`` of a ``tensor`` x ``pipeline`` member is tensor rank ``r % tensor`` of pipeline stage
    ``r // tensor`` (Megatron's order). Stages pass one sequence's hidden states at a time to the same tensor rank of
    the next stage (point to point) and the gradients of those states back, so a micro-step runs through the stages
    one after another: a pipeline's memory split, not its overlap (one micro-step per member at a time)."""

    def __init__(self, model_config: dict[str, Any], rank: int, tensor: int, pipeline: int) -> None:
        self.rank, self.tensor, self.stages = rank, tensor, pipeline
        self.stage, self.tensor_rank = divmod(rank, tensor)
        self.first, self.last = self.stage == 0, self.stage == pipeline - 1
        self.arch = convert.Architecture.from_hf(model_config)
        self.arch.check_split(tensor, pipeline)
        self.layout = convert.hf_layout(model_config)
        self.numel = sum(math.prod(shape) for _, shape in self.layout)
        self.model = build_model(self.arch, tensor, self.stage, pipeline)
        self.reference: Any | None = None
        self.staging = torch.empty(self.numel, dtype=torch.float32)  # the Hugging Face flat buffer
        meta = {name: torch.empty(shape, device="meta") for name, shape in self.layout}
        # every rank's parameters in the order its gradients travel to rank 0 (the mapping's order)
        self.shapes = [
            [(n, tuple(t.shape)) for n, t in self._convert(meta, r).items()] for r in range(tensor * pipeline)
        ]

    def _convert(self, hf: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
        stage, tensor_rank = divmod(rank, self.tensor)
        return convert.to_megatron(hf, self.arch, tensor_rank, self.tensor, stage, self.stages)

    def load(self, reference: bool = False) -> None:
        """``staging`` (broadcast from rank 0) into this rank's shard of the model or of the reference."""
        if self.tensor * self.stages > 1:
            dist.broadcast(self.staging, src=0)
        if reference and self.reference is None:
            self.reference = build_model(self.arch, self.tensor, self.stage, self.stages).eval()
            self.reference.requires_grad_(False)
        target = self.reference if reference else self.model
        assert target is not None
        params = dict(target.named_parameters())
        shard = self._convert(convert.unflatten(self.staging, self.layout), self.rank)
        if shard.keys() != params.keys():  # the mapping and this megatron-core disagree: say where
            raise ConfigError(
                f"the Hugging Face -> Megatron mapping does not fit megatron-core's model: mapped but absent "
                f"{sorted(shard.keys() - params.keys())}, present but unmapped {sorted(params.keys() - shard.keys())}"
            )
        with torch.no_grad():
            for name, value in shard.items():
                params[name].copy_(value)

    def compute(self, micro: MicroStep, loss: LossConfig, version: int) -> MicroStats | None:
        """Forward and backward of ``micro``; its figures on rank 0 (None on the other ranks)."""
        if self.stages == 1:
            return compute_gradients(
                self.model, micro, loss, version, self.reference, token_logprobs_and_entropy
            )
        if self.last:
            return self._compute_last(micro, loss, version)
        outputs, inputs = [], []
        reference = [self.reference] if loss.kl_coef > 0 else []
        models = [self.model, *reference]  # in the order the last stage's loss asks for their forwards
        for model in models:
            for ids, positions, parents in sequences(micro):
                with torch.set_grad_enabled(model is self.model):
                    hidden = None if self.first else self._receive(len(ids), self.rank - self.tensor)
                    if hidden is not None and model is self.model:
                        hidden.requires_grad_()
                    out = decode(model, ids, positions, parents, hidden)
                dist.send(out.detach().contiguous(), self.rank + self.tensor)
                if model is self.model:
                    outputs.append(out)
                    inputs.append(hidden)
        torch.autograd.backward(
            outputs, [self._receive(out.shape[0], self.rank + self.tensor) for out in outputs]
        )
        if not self.first:
            for hidden in inputs:
                assert hidden is not None and hidden.grad is not None
                dist.send(hidden.grad.contiguous(), self.rank - self.tensor)
        return self._stats_from_last() if self.rank == 0 else None

    def _compute_last(self, micro: MicroStep, loss: LossConfig, version: int) -> MicroStats | None:
        received: list[torch.Tensor] = []

        def forward(model: Any, micro: MicroStep, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
            pieces, entropies = [], []
            for ids, positions, parents in sequences(micro):
                hidden = self._receive(len(ids), self.rank - self.tensor)
                if model is self.model:
                    received.append(hidden.requires_grad_())
                lp, ent = head(
                    model, decode(model, ids, positions, parents, hidden), ids, parents, temperature
                )
                pieces.append(lp)
                entropies.append(ent)
            return torch.cat(pieces), torch.cat(entropies)

        stats = compute_gradients(self.model, micro, loss, version, self.reference, forward)
        for hidden in received:
            assert hidden.grad is not None
            dist.send(hidden.grad.contiguous(), self.rank - self.tensor)
        if self.tensor_rank == 0:  # rank 0 reports the figures
            payload = torch.frombuffer(bytearray(_stats_encoder.encode(stats)), dtype=torch.uint8)
            dist.send(torch.tensor([payload.numel()]), 0)
            dist.send(payload, 0)
        return None

    def _stats_from_last(self) -> MicroStats:
        n = torch.zeros(1, dtype=torch.int64)
        last = (self.stages - 1) * self.tensor
        dist.recv(n, last)
        payload = torch.empty(int(n), dtype=torch.uint8)
        dist.recv(payload, last)
        return _stats_decoder.decode(payload.numpy().tobytes())

    def _receive(self, tokens: int, source: int) -> torch.Tensor:
        """One sequence's hidden states (from the stage before) or their gradient (from the stage after)."""
        buffer = torch.empty(tokens, 1, self.arch.hidden)
        dist.recv(buffer, source)
        return buffer

    def gather(self) -> torch.Tensor | None:
        """Every rank's gradients to rank 0, there in the exchange layout (other ranks: None); clears them."""
        params = dict(self.model.named_parameters())
        local = torch.cat(
            [
                (params[n].grad if params[n].grad is not None else torch.zeros_like(params[n])).reshape(-1)
                for n, _ in self.shapes[self.rank]
            ]
        )
        self.model.zero_grad(set_to_none=True)
        if self.rank != 0:
            dist.send(local, 0)
            return None
        shards = []
        for r, shapes in enumerate(self.shapes):
            if r == 0:
                piece = local
            else:
                piece = torch.empty(sum(math.prod(shape) for _, shape in shapes))
                dist.recv(piece, r)
            offset, shard = 0, {}
            for name, shape in shapes:
                shard[name] = piece[offset : offset + math.prod(shape)].view(shape)
                offset += math.prod(shape)
            shards.append(shard)
        hf = convert.to_hf(shards, self.arch, gradients=True, stages=self.stages)
        return convert.flatten(hf, self.layout)


class MegatronLearner:
    """Rank 0 of a Megatron member of ``tensor`` x ``pipeline`` processes (a `gyre.train.learner.Learner`)."""

    def __init__(
        self, model_config: dict[str, Any], tensor: int = 1, pipeline: int = 1, num_threads: int = 0
    ) -> None:
        compat.import_megatron()
        convert.Architecture.from_hf(model_config).check_split(
            tensor, pipeline
        )  # refused before anything starts
        self.version = -1
        self.followers: list[Process] = []
        address = f"tcp://127.0.0.1:{free_port()}"
        setup = json.dumps({"config": model_config, "tensor": tensor, "pipeline": pipeline, "address": address,
                            "threads": num_threads})  # fmt: skip
        for rank in range(1, tensor * pipeline):
            self.followers.append(spawn(
                [sys.executable, "-m", "gyre.train.megatron.member", str(rank)],
                stdin=subprocess.PIPE, env={**os.environ, "GYRE_SHARD_SETUP": setup},
            ))  # fmt: skip
        compat.init_parallel(0, address, tensor, pipeline)
        self.shard = Shard(model_config, 0, tensor, pipeline)
        self.numel = self.shard.numel

    def _tell(self, command: MegatronCommand) -> None:
        payload = _encoder.encode(command)
        for follower in self.followers:
            assert follower.stdin is not None
            follower.stdin.write(struct.pack("<I", len(payload)) + payload)
            follower.stdin.flush()

    def weights(self) -> torch.Tensor:
        return self.shard.staging

    def loaded(self, version: int) -> None:
        self._tell(MegatronLoad())
        self.shard.load()
        self.version = version

    def load_reference(self, flat: torch.Tensor) -> None:
        self.shard.staging.copy_(flat)
        self._tell(MegatronLoad(reference=True))
        self.shard.load(reference=True)

    def compute(self, micro: MicroStep, loss: LossConfig, version: int) -> MicroStats:
        self._tell(MegatronCompute(micro=micro, loss=msgspec.to_builtins(loss), version=version))
        stats = self.shard.compute(micro, loss, version)
        assert stats is not None  # rank 0 always has the figures
        return stats

    def gradient(self) -> torch.Tensor:
        self._tell(MegatronGather())
        flat = self.shard.gather()
        assert flat is not None
        return flat

    def close(self) -> None:
        """Stop the other ranks (they exit after the command they run)."""
        with contextlib.suppress(BrokenPipeError, OSError):  # a rank that died already
            self._tell(MegatronStop())
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


def _read(stream: IO[bytes]) -> MegatronCommand | None:
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
    compat.init_parallel(rank, setup["address"], setup["tensor"], setup["pipeline"])
    shard = Shard(setup["config"], rank, setup["tensor"], setup["pipeline"])
    while True:
        match _read(sys.stdin.buffer):
            case MegatronLoad(reference=reference):
                shard.load(reference)
            case MegatronCompute(micro=micro, loss=loss, version=version):
                shard.compute(micro, msgspec.convert(loss, LossConfig), version)
            case MegatronGather():
                shard.gather()
            case MegatronStop() | None:
                return


if __name__ == "__main__":
    follow(int(sys.argv[1]))

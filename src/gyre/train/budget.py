"""What one training step of one long micro-step costs: FLOPs, and bytes on each rank of a context-parallel group.

Pure arithmetic on a model's shapes (a Hugging Face ``config.json`` dict), no torch. It extends the memory model of
`gyre.train.memory` (whose parameter counts, precisions and per-token activations it reuses) with what long
contexts add: attention's compute, quadratic in the tokens, and context parallelism (``cp`` ranks sharing one
micro-step, `gyre.train.context`). ``benchmarks/xlong.py`` prints it as "predicted" beside what it measures and
projects Qwen3-8B at 700K tokens with it; ``benchmarks/gpu_check.py`` prints it before the tiny model's 700K step.

FLOPs of one micro-step's forward and backward (multiply-add = 2 FLOPs, backward = 2 x forward):

- linear: ``6 x matrix parameters x tokens`` for the decoder's layers (q, k, v, o and the MLP's matrices; norms and
  the embedding lookup are not counted); activation checkpointing recomputes each layer's forward: 8 instead of 6.
  Plus ``8 x vocab x hidden x scored tokens`` for the lm head: logits only where a token is scored, each chunk's
  forward recomputed in backward (`gyre.train.loss.chunked_logprobs`).
- attention: ``QK^T`` and ``PV`` cost ``2 x 2 x head_dim`` FLOPs per (query, key) pair per query head; a causal
  chain of ``n`` tokens has ``n (n + 1) / 2`` pairs (a tree fewer: pass ``attention_pairs``), so forward + backward
  is ``12 x pairs x head_dim x heads x layers`` (16 with checkpointing). This is the quadratic term.

Split over ``cp`` ranks, each rank computes ``1/cp`` of both (load-balanced halves, as `ContextSplit` does).

Bytes per rank (`StepBudget.memory`, by name):

- ``weights``, ``gradients``, ``master``, ``moments``: `gyre.train.memory.device_memory` of a ``sharded`` design
  with ``optimizer_shards`` ranks splitting the master weights, moments and gradient sum (1: not sharded; ZeRO-1
  over the cell: its size). No weight-push buffer. ``full_shard`` (FSDP / ZeRO-3): the weights and the local
  gradient are split over those ranks too, plus two layers' weights gathered whole (the one computed and the one
  prefetched).
- ``activations``: that model's activations (flash attention: no ``[T x T]`` tensor) for this rank's
  ``tokens / cp`` tokens, with or without checkpointing.
- ``keys_values`` (``cp > 1``): ring attention's blocks in flight (`gyre.train.context`), one layer at a time: the
  block attended and the one arriving, each ``2 x kv_heads x head_dim`` values a token of a rank's share in the
  activation dtype, and in backward their two gradient blocks in fp32 (or wider). A rank's own keys and values are
  in ``activations``; no rank keeps another's, and grouped heads are never repeated per query head.
- ``logits``: one chunk of fp32 logits and their gradient, ``logits_chunk_tokens`` (default: as many as
  ``LOGITS_CHUNK_BYTES`` of logits hold) or this rank's share of the scored tokens if fewer, and this rank's final hidden states (as ``device_memory``'s ``logits``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gyre.train.memory import FP32, GIB, CellLayout, ModelShape, Precision, device_memory

LOGITS_CHUNK_BYTES = 128 * 2**20  # as gyre.train.loss's (not imported: this module imports no torch)
# A process that trains in fp32 and applies its own update (a benchmark's rank, one GPU): no core's step sum
FP32_LOCAL = Precision("fp32, local update", weight=4, gradient=4, master=0, moment=4, gradient_sum=0, wire=4,
                       activation=4)  # fmt: skip


def causal_pairs(tokens: int) -> int:
    """(query, key) pairs of causal attention over one chain of ``tokens`` tokens, each attending to itself."""
    return tokens * (tokens + 1) // 2


def tree_pairs(parents: list[int]) -> int:
    """(query, key) pairs of ancestor-only attention over a packed tree: each token's depth + 1."""
    depth: list[int] = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return sum(depth) + len(depth)


def matrix_parameters(shape: ModelShape) -> int:
    """Parameters of the decoder layers' matrices one token goes through (active experts only), without norms."""
    dense = shape.num_layers - shape.moe_layers
    moe = shape.moe_layers * shape.layer_parameters(True, True)[0]
    return dense * shape.layer_parameters(False)[0] + moe


@dataclass(frozen=True)
class StepBudget:
    """One micro-step's training cost: FLOPs of the whole micro-step, bytes on each of its ``cp`` ranks."""

    tokens: int
    cp: int
    linear_flops: int  # decoder matrices and lm head, forward + backward (+ recomputation)
    attention_flops: int  # (query, key) pairs: the quadratic term
    memory: dict[str, int]  # bytes per rank, by name (see the module)

    @property
    def flops(self) -> int:
        return self.linear_flops + self.attention_flops

    @property
    def flops_per_rank(self) -> float:
        return self.flops / self.cp

    @property
    def memory_bytes(self) -> int:
        """Bytes per rank, all terms."""
        return sum(self.memory.values())

    @property
    def step_bytes(self) -> int:
        """Bytes per rank that a step adds to a loaded model (everything but the weights)."""
        return self.memory_bytes - self.memory["weights"]

    def seconds(self, dense_flops_per_s: float, attention_flops_per_s: float) -> float:
        """Wall seconds of one rank's share at the given throughputs (one device's, FLOP/s)."""
        return (
            self.linear_flops / dense_flops_per_s + self.attention_flops / attention_flops_per_s
        ) / self.cp

    def fits(self, device_bytes: int = 80 * GIB, usable_fraction: float = 0.9) -> bool:
        """Whether a rank's bytes fit in ``usable_fraction`` of a device (the rest: context, buffers)."""
        return self.memory_bytes <= device_bytes * usable_fraction


def step_budget(
    config: Mapping[str, Any],
    tokens: int,
    *,
    cp: int = 1,
    precision: Precision = FP32,
    checkpointing: bool = False,
    logits_chunk_tokens: int | None = None,
    scored_tokens: int | None = None,
    attention_pairs: int | None = None,
    optimizer_shards: int = 1,
    full_shard: bool = False,
) -> StepBudget:
    """The FLOPs and per-rank bytes of one step training ``tokens`` tokens of the model of ``config`` on ``cp``
    ranks (see the module). ``scored_tokens``: tokens whose logits are computed (default: all);
    ``attention_pairs``: (query, key) pairs (default: one causal chain); ``optimizer_shards``: ranks the optimizer
    state is split over; ``full_shard``: the weights and gradients too (FSDP)."""
    if tokens < 1 or cp < 1 or optimizer_shards < 1:
        raise ValueError(
            f"tokens ({tokens}), cp ({cp}) and optimizer_shards ({optimizer_shards}) must be >= 1"
        )
    shape = ModelShape.from_config(config)
    logits_chunk_tokens = logits_chunk_tokens or max(1, LOGITS_CHUNK_BYTES // (4 * shape.vocab_size))
    scored = tokens if scored_tokens is None else scored_tokens
    pairs = causal_pairs(tokens) if attention_pairs is None else attention_pairs
    # FLOPs per parameter a token: 2 forward + 4 backward (+ 2 of the forward recomputed)
    passes = 8 if checkpointing else 6
    linear = passes * matrix_parameters(shape) * tokens + 8 * shape.vocab_size * shape.hidden_size * scored
    attention = (passes * 2) * pairs * shape.head_dim * shape.num_heads * shape.num_layers
    local = math.ceil(tokens / cp)
    held = device_memory(
        shape, CellLayout(shards=optimizer_shards), precision, local, design="sharded",
        checkpointing=checkpointing, loss_chunk_tokens=logits_chunk_tokens, bucket_bytes=0, engine_bytes=0,
    )  # fmt: skip
    block = 2 * shape.kv_size * local  # one rank's keys and values, values
    in_flight = 2 * block * precision.activation + 2 * block * max(4, precision.activation) if cp > 1 else 0
    weights, gradients = held.weights, held.gradients
    if full_shard:
        whole = shape.parameters()
        layer = max(sum(shape.layer_parameters(shape.moe_layers > 0)), sum(shape.layer_parameters(False)))
        weights = math.ceil(whole / optimizer_shards) * precision.weight + 2 * layer * precision.weight
        gradients -= (whole - math.ceil(whole / optimizer_shards)) * precision.gradient
    chunk = min(logits_chunk_tokens, math.ceil(scored / cp))
    logits = chunk * shape.vocab_size * 8 + local * shape.hidden_size * precision.activation
    memory = {
        "weights": weights,
        "gradients": gradients,
        "master": held.master,
        "moments": held.moments,
        "activations": held.activations,
        "keys_values": in_flight,
        "logits": logits,
    }
    return StepBudget(tokens=tokens, cp=cp, linear_flops=linear, attention_flops=attention, memory=memory)

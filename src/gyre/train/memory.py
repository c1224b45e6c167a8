"""What one device of a training cell holds, and what gradient bytes reach one process per step: an accounting model.

Pure arithmetic on a model's shapes (read from a Hugging Face ``config.json`` dict), a cell layout and precisions; no
torch. ``benchmarks/memory.py`` checks it against the tensors of today's core on CPU and projects Qwen3 models onto
8 x 80 GB cells, printing the assumptions below (``ASSUMPTIONS``). Every figure is bytes.

Two designs of the core:

- ``star`` (today's): one process holds the whole model, its gradient, the step's gradient sum, a receive buffer for
  a member's whole flat gradient, the master weights and AdamW's moments, whatever the layout; tensor/pipeline
  parallel split only the compute (activations). Every micro-step computed elsewhere sends its whole fp32 gradient
  into that process.
- ``sharded`` (ZeRO-1 inside the core cell): every rank holds its tensor/pipeline part of the weights and of the
  local gradient; the fp32 master weights, AdamW's moments and the step's gradient sum of that part are split over
  ``shards`` data-parallel ranks. Gradients are reduce-scattered in buckets once per step.

Assumptions:
1. Parameters: a Qwen3/Llama decoder: q, k, v, o without bias unless ``attention_bias``; per-head RMSNorm on q and k
   on qwen3; two RMSNorms a layer and a final one; a SwiGLU MLP of 3 matrices. An MoE layer has a router (hidden x
   experts) and experts x 3 matrices of ``moe_intermediate_size``, no shared expert. No lm_head when tied.
2. Tensor parallel splits every matrix (embedding and lm_head over the vocabulary, experts too); norms and the router
   are replicated. A pipeline stage holds ceil(layers / pipeline) of the largest layers plus the embedding or the
   lm_head (the busiest stage). Expert parallelism is not modelled.
3. Precisions: ``bf16``: weights and local gradients bf16 (2 B), fp32 master weights (4 B), AdamW's exp_avg and
   exp_avg_sq fp32 (4 B each), the step's gradient sum fp32. ``bf16, fp32 grads``: the same with Megatron's default
   fp32 gradient buffer. ``fp32`` (today's CPU core): weights, gradients and moments fp32, no master copy, the step's
   sum float64 (8 B) as ``gyre.train.state`` keeps it.
4. ``sharded``: master, moments and the step's gradient sum are 1/shards of the rank's part; weights and the local
   gradient buffer are whole on every rank (ZeRO-1, not ZeRO-2/3). ``star``: the core holds all of it for the whole
   model, plus one fp32 receive buffer per member gradient in flight.
5. Activations, with flash attention (no [T x T] tensor), per token per layer in the activation dtype: 7 x hidden
   (each of the two RMSNorms keeps its input, its normalised input and its weighted output; o_proj keeps its input)
   + 2 x (q + 2 kv) (q, k, v before and after norm and rope; grouped key/value heads as the model has them, never
   repeated per query head) + q (attention output) + 4 x intermediate (gate, up, silu(gate), their product; on MoE
   layers per active expert, plus the routed copies of the hidden state), and fp32: 2 norms' reciprocal RMS, the
   log-sum-exp per head, and with q/k norms their reciprocal RMS per q and kv head (and router logits). Counted
   from the tensors Hugging Face's Qwen3 keeps for backward on CPU (``tests/unit/train/test_memory.py``). Tensor
   parallel with sequence parallel divides all of it by tensor. Activation checkpointing keeps one hidden state
   per layer plus one layer being recomputed. 1F1B pipelining keeps ``pipeline`` micro-steps in flight on the
   first stage, so a device holds one micro-step's activations of all layers / tensor.
6. Logits: the loss runs in chunks of ``loss_chunk_tokens`` tokens, each with fp32 logits and their gradient over
   vocab / tensor columns; the micro-step's final hidden states are kept for lm_head's backward.
7. Weight push: ``sharded`` pushes bucket by bucket; its extra memory is max(bucket, largest whole tensor) in the
   engine's dtype (a tensor-parallel tensor is gathered whole). ``star`` pushes one flattened copy of the model in the
   engine's dtype (none when that is already the weights' dtype).
8. Fits: total <= ``usable_fraction`` (0.9) of device memory; the rest is the CUDA context, NCCL buffers and
   allocator fragmentation. An "80 GB" device is taken as 80 GiB.
9. Gradient bytes into one process per step: ``star`` = remote micro-steps x the whole fp32 gradient (into the core's
   one process, even from a Megatron member, whose learner gathers it); ``sharded`` = one ring reduce-scatter of each
   rank's fp32 part over the step's members (the core's shards plus one per satellite): (members - 1) / members x
   the part, however many micro-steps.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

GIB = 1024**3


def _numbered(text: str) -> tuple[str, ...]:
    """The numbered paragraphs after "Assumptions:" in ``text``, each on one line (none: docstrings stripped)."""
    _, _, tail = text.partition("Assumptions:\n")
    return tuple(" ".join(part.split()) for part in re.split(r"\n(?=\d+\. )", tail) if part.strip())


ASSUMPTIONS = _numbered(__doc__ or "")  # benchmarks/memory.py prints them


@dataclass(frozen=True)
class ModelShape:
    """The shapes that decide a decoder's parameter count and activations."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP width
    vocab_size: int
    tied_embeddings: bool
    qk_norm: bool = True  # Qwen3's per-head RMSNorm on q and k
    attention_bias: bool = False
    num_experts: int = 0  # 0: a dense model
    active_experts: int = 0  # experts per token
    expert_intermediate_size: int = 0
    moe_layers: int = 0  # layers whose MLP is the experts' (the rest are dense)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """The shape of a Hugging Face ``config.json`` dict (qwen3, qwen3_moe, qwen2, llama, mixtral field names)."""
        model_type = str(config.get("model_type", "qwen3"))
        heads = int(config["num_attention_heads"])
        layers = int(config["num_hidden_layers"])
        experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
        moe_layers = 0
        if experts:
            step = int(config.get("decoder_sparse_step", 1))
            dense_only = set(config.get("mlp_only_layers", []))
            moe_layers = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        return cls(
            hidden_size=int(config["hidden_size"]),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            qk_norm=model_type.startswith("qwen3"),
            attention_bias=bool(config.get("attention_bias", model_type == "qwen2")),
            num_experts=experts,
            active_experts=int(config.get("num_experts_per_tok", 0)) if experts else 0,
            expert_intermediate_size=int(config.get("moe_intermediate_size", 0)) if experts else 0,
            moe_layers=moe_layers,
        )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def attention_parameters(self) -> tuple[int, int]:
        """(split by tensor parallel, replicated) parameters of one layer's attention and its two norms."""
        h, q, kv = self.hidden_size, self.q_size, self.kv_size
        split = h * (q + 2 * kv) + q * h + (q + 2 * kv if self.attention_bias else 0)
        replicated = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        return split, replicated

    def mlp_parameters(self, moe: bool, active: bool = False) -> tuple[int, int]:
        """(split, replicated) parameters of one layer's MLP; ``active``: only the experts a token uses."""
        h = self.hidden_size
        if not moe:
            return 3 * h * self.intermediate_size, 0
        experts = self.active_experts if active else self.num_experts
        return experts * 3 * h * self.expert_intermediate_size, h * self.num_experts

    def layer_parameters(self, moe: bool, active: bool = False) -> tuple[int, int]:
        a_split, a_rep = self.attention_parameters()
        m_split, m_rep = self.mlp_parameters(moe, active)
        return a_split + m_split, a_rep + m_rep

    @property
    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def head_parameters(self) -> int:
        """lm_head's own parameters (0 when tied to the embedding)."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    def parameters(self, active: bool = False) -> int:
        """Parameters of the whole model, stored once (tied weights once); ``active``: those one token uses."""
        dense = self.num_layers - self.moe_layers
        layers = dense * sum(self.layer_parameters(False)) + self.moe_layers * sum(
            self.layer_parameters(True, active)
        )
        return self.embedding_parameters + self.head_parameters + layers + self.hidden_size

    def device_parameters(self, tensor: int, pipeline: int) -> int:
        """Parameters on the busiest device of a tensor x pipeline layout (see ``ASSUMPTIONS``)."""
        if pipeline == 1:
            split = self.parameters() - self._replicated()
            return math.ceil(split / tensor) + self._replicated()
        worst = max(self.layer_parameters(self.moe_layers > 0), self.layer_parameters(False), key=sum)
        stage_layers = math.ceil(self.num_layers / pipeline)
        split = stage_layers * worst[0] + self.embedding_parameters  # first stage: embedding; last: lm_head
        return math.ceil(split / tensor) + stage_layers * worst[1] + self.hidden_size

    def _replicated(self) -> int:
        dense = self.num_layers - self.moe_layers
        return (
            dense * self.layer_parameters(False)[1]
            + self.moe_layers * self.layer_parameters(True)[1]
            + self.hidden_size
        )

    def largest_tensor(self) -> int:
        """Values in the largest single weight tensor (the embedding, or a dense MLP matrix)."""
        return max(self.embedding_parameters, self.hidden_size * self.intermediate_size)

    def activation_values_per_token_layer(self, moe: bool) -> tuple[int, int]:
        """(values in the activation dtype, fp32 values) one layer keeps per token for backward (flash attention)."""
        h, q, kv = self.hidden_size, self.q_size, self.kv_size
        attention = 7 * h + 2 * (q + 2 * kv) + q
        # norms' reciprocal RMS, log-sum-exp per head, q/k norms' reciprocal RMS per head
        fp32 = 2 + self.num_heads + (self.num_heads + self.num_kv_heads if self.qk_norm else 0)
        if moe:
            mlp = self.active_experts * (4 * self.expert_intermediate_size + h)
            fp32 += self.num_experts  # router logits
        else:
            mlp = 4 * self.intermediate_size
        return attention + mlp, fp32


@dataclass(frozen=True)
class Precision:
    """Bytes per value of each kind of state."""

    name: str
    weight: int  # the weights computed with
    gradient: int  # gradients as backward writes and accumulates them locally
    master: int  # the master copy the optimizer updates (0: the weights are the master)
    moment: int  # each of AdamW's exp_avg and exp_avg_sq
    gradient_sum: int  # the step's gradient sum in the core
    wire: int  # a gradient value on the wire
    activation: int  # activations kept for backward
    local_sum: int = (
        0  # a rank's sum of its own micro-steps' gradients, whole replica, until the step's reduction
    )


BF16 = Precision("bf16", weight=2, gradient=2, master=4, moment=4, gradient_sum=4, wire=4, activation=2)
# Megatron's default for bf16 (accumulate_allreduce_grads_in_fp32): the local gradient buffer in fp32
BF16_FP32_GRADS = Precision(
    "bf16, fp32 grads", weight=2, gradient=4, master=4, moment=4, gradient_sum=4, wire=4, activation=2
)
FP32 = Precision("fp32", weight=4, gradient=4, master=0, moment=4, gradient_sum=8, wire=4, activation=4)


@dataclass(frozen=True)
class CellLayout:
    """A cell's ranks: tensor x pipeline model parallel, times ``shards`` data-parallel optimizer shards."""

    tensor: int = 1
    pipeline: int = 1
    shards: int = 1  # data-parallel ranks the master weights, moments and gradient sum are split over
    device_bytes: int = 80 * GIB
    usable_fraction: float = 0.9  # of device memory the training state may take (see ASSUMPTIONS)

    def __post_init__(self) -> None:
        for name in ("tensor", "pipeline", "shards", "device_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"CellLayout.{name} = {getattr(self, name)}: it must be at least 1")

    @property
    def devices(self) -> int:
        """Devices (ranks) in the cell."""
        return self.tensor * self.pipeline * self.shards

    def check(self, shape: ModelShape) -> None:
        """Raise ValueError saying why this layout cannot split ``shape``."""
        if shape.num_heads % self.tensor:
            raise ValueError(f"tensor = {self.tensor} does not divide the {shape.num_heads} attention heads")
        if shape.num_kv_heads % self.tensor and self.tensor % shape.num_kv_heads:
            raise ValueError(
                f"tensor = {self.tensor} and the {shape.num_kv_heads} key/value heads do not divide"
            )
        if self.pipeline > shape.num_layers:
            raise ValueError(f"pipeline = {self.pipeline} stages for {shape.num_layers} layers")


Design = Literal["star", "sharded"]
CATEGORIES = ("weights", "gradients", "master", "moments", "activations", "logits", "push")


@dataclass(frozen=True)
class DeviceMemory:
    """Bytes on the busiest device of a cell, by category."""

    weights: int
    gradients: int  # local gradient buffer and local sum + the step's sum (+ receive buffers in the star)
    master: int
    moments: int
    activations: int
    logits: int
    push: int  # extra memory of a weight push to engines
    usable_bytes: int

    @property
    def total(self) -> int:
        return sum(self.by_category().values())

    @property
    def state(self) -> int:
        """Bytes independent of the micro-step (weights, gradients, master, moments, push)."""
        return self.weights + self.gradients + self.master + self.moments + self.push

    @property
    def fits(self) -> bool:
        return self.total <= self.usable_bytes

    def by_category(self) -> dict[str, int]:
        return {c: getattr(self, c) for c in CATEGORIES}


def device_memory(
    shape: ModelShape,
    layout: CellLayout,
    precision: Precision = BF16,
    micro_tokens: int = 0,
    *,
    design: Design = "sharded",
    checkpointing: bool = True,
    loss_chunk_tokens: int = 4096,
    bucket_bytes: int = 512 * 2**20,
    engine_bytes: int = 2,
    receive_buffers: int = 1,
) -> DeviceMemory:
    """Bytes on the busiest device of ``layout`` training ``shape`` on micro-steps of ``micro_tokens`` tokens.

    ``design``: today's ``star`` core or the ``sharded`` one (see the module); ``checkpointing``: activation
    recomputation per layer; ``engine_bytes``: bytes per value of the engines' weights; ``receive_buffers``: member
    gradients the star's core receives at once. Every assumption is in ``ASSUMPTIONS``.
    """
    layout.check(shape)
    t, p = layout.tensor, layout.pipeline
    part = shape.device_parameters(t, p)  # the parameters this device computes with
    if design == "star":
        held, shards = shape.parameters(), 1  # the core process holds the whole model's state
        receive = receive_buffers * precision.wire * held
        push = held * engine_bytes if engine_bytes != precision.weight else 0
    else:
        held, shards = part, layout.shards
        receive = 0
        push = max(bucket_bytes, shape.largest_tensor() * engine_bytes)
    sharded = math.ceil(held / shards)
    act = _activations(shape, layout, precision, micro_tokens, checkpointing)
    vocab_part = math.ceil(shape.vocab_size / t)
    logits = 0
    if micro_tokens:
        chunk = min(loss_chunk_tokens, micro_tokens)
        logits = chunk * vocab_part * 8 + micro_tokens * shape.hidden_size * precision.activation // t
    return DeviceMemory(
        weights=held * precision.weight,
        gradients=held * (precision.gradient + precision.local_sum)
        + sharded * precision.gradient_sum
        + receive,
        master=sharded * precision.master,
        moments=sharded * 2 * precision.moment,
        activations=act,
        logits=logits,
        push=push,
        usable_bytes=int(layout.device_bytes * layout.usable_fraction),
    )


def _activations(
    shape: ModelShape, layout: CellLayout, precision: Precision, tokens: int, checkpointing: bool
) -> int:
    moe = shape.moe_layers > 0
    values, fp32 = shape.activation_values_per_token_layer(moe)
    if moe and shape.moe_layers < shape.num_layers:
        values = max(values, shape.activation_values_per_token_layer(False)[0])
    per_layer = values * precision.activation + fp32 * 4  # bytes per token
    if checkpointing:
        per_token = shape.num_layers * shape.hidden_size * precision.activation + per_layer
    else:
        per_token = shape.num_layers * per_layer
    return math.ceil(tokens * per_token / layout.tensor)


def max_micro_tokens(
    shape: ModelShape, layout: CellLayout, precision: Precision = BF16, **kwargs: Any
) -> int:
    """The most tokens a micro-step may have for ``device_memory`` to fit (0: not even the state fits)."""
    if not device_memory(shape, layout, precision, 1, **kwargs).fits:
        return 0
    low, high = 1, 1 << 24  # 16 M tokens bounds every case here
    while low < high:  # memory grows with tokens: bisect
        mid = (low + high + 1) // 2
        if device_memory(shape, layout, precision, mid, **kwargs).fits:
            low = mid
        else:
            high = mid - 1
    return low


@dataclass(frozen=True)
class GradientTraffic:
    """Gradient bytes into the one process that receives the most, per optimizer step."""

    star: int  # today: every remote micro-step's whole fp32 gradient into the core
    reduce_scatter: int  # sharded: one bucketed ring reduce-scatter of each rank's part per step
    model_gradient: int  # one whole fp32 gradient of the model, for scale


def gradient_traffic(
    shape: ModelShape, layout: CellLayout, precision: Precision, remote_micro_steps: int, satellites: int
) -> GradientTraffic:
    """Bytes into any one process per step with ``remote_micro_steps`` micro-steps computed outside the core and
    ``satellites`` satellite cells of the core's tensor x pipeline layout: each of the core's ``shards`` ranks and
    each satellite holds a copy of every part, so a part's reduce-scatter runs over shards + satellites members."""
    whole = shape.parameters() * precision.wire
    part = shape.device_parameters(layout.tensor, layout.pipeline) * precision.wire
    members = layout.shards + satellites
    ring = part * (members - 1) // members
    return GradientTraffic(star=remote_micro_steps * whole, reduce_scatter=ring, model_gradient=whole)


def held_bytes(model: Any, optimizer: Any, *extra_gradients: Any) -> dict[str, int]:
    """Bytes a process holds, counted from its tensors: ``weights`` (the model's parameters), ``gradients`` (their
    ``.grad`` plus ``extra_gradients``, e.g. the core's step sum) and ``moments`` (every tensor in the optimizer's
    state). Each storage is counted once, so tied weights and views of one flat buffer are not double counted."""
    seen: set[int] = set()

    def nbytes(tensors: Any) -> int:
        total = 0
        for tensor in tensors:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total

    params = list(model.parameters())
    state = [v for entry in optimizer.state.values() for v in entry.values() if hasattr(v, "untyped_storage")]
    return {
        "weights": nbytes(params),
        "gradients": nbytes([p.grad for p in params if p.grad is not None]) + nbytes(extra_gradients),
        "moments": nbytes(state),
    }

"""A Megatron-core GPTModel of a Hugging Face checkpoint, and the log-probabilities of a packed micro-step under it.

The model is built from the local (pure megatron-core) layer spec, so it runs wherever torch does, with one module
of Gyre's in it: the core attention (`SegmentAttention`, the softmax(QK^T)V step between Megatron's own query/key/
value and output projections). It is what makes tree micro-steps cost what the torch backend's do:

- a chain takes causal scaled-dot-product attention (a fused kernel wherever torch has one);
- a tree takes the torch backend's segment attention: cut into chain segments, each segment's queries attend to its
  ancestors' keys and values (gathered by index) plus a causal block over its own, so a tree costs the attention pairs
  it needs, never an ``n x n`` mask or score matrix.

The forward is Gyre's own walk through the model's parts (embedding, decoder, output layer) rather than
``GPTModel.forward``, because a tree's rotary positions are depths (``position_ids``) where ``GPTModel`` rotates by
index, and because the segments of the sequence being computed reach the attention modules through a context variable
set around the decoder.

Log-probabilities come from vocabulary-parallel logits (each tensor-parallel rank holds a slice of the vocabulary)
through Megatron's vocab-parallel cross-entropy; the entropy is reduced over the group without gradient. Every rank
ends with the same per-token values, so the loss and its ``backward`` run identically on each rank.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from gyre.train.attention import Segment, segment_attention
from gyre.train.loss import sequence_bounds, tree_segments
from gyre.train.megatron.compat import import_megatron
from gyre.train.megatron.convert import Architecture

if TYPE_CHECKING:
    from gyre.protocol import MicroStep


# the chain segments of the tree the decoder is computing (None: a chain, causal attention)
_segments: contextvars.ContextVar[list[Segment] | None] = contextvars.ContextVar(
    "gyre_megatron_segments", default=None
)


class SegmentAttention(torch.nn.Module):
    """Megatron's core-attention slot (built with the arguments its ``DotProductAttention`` takes): ancestor-only
    attention over this rank's heads; queries ``[tokens, batch, heads, dim]``, output ``[tokens, batch, heads * dim]``."""

    def __init__(
        self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str, **kwargs: Any
    ) -> None:
        super().__init__()
        scale = kwargs.get("softmax_scale")
        self.scale = float(scale) if scale is not None else config.kv_channels**-0.5

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any
    ) -> torch.Tensor:
        tokens, batch, heads, dim = query.shape
        groups = heads // key.shape[2]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [batch, heads, tokens, dim]
        if groups > 1:  # grouped-query attention: each key/value head serves its group's query heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        segments = _segments.get()
        if segments is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        else:
            out = segment_attention(q, k, v, segments, self.scale)
        return out.permute(2, 0, 1, 3).reshape(tokens, batch, heads * dim)


def build_model(arch: Architecture, size: int = 1, stage: int = 0, stages: int = 1) -> Any:
    """A float32 GPTModel of ``arch``: this process's part of a ``size``-way tensor-parallel, ``stages``-stage
    pipeline-parallel member (its parallel state set up by `init_parallel`). With several stages a tied output layer
    is the last stage's own copy (see `convert.to_megatron`): Megatron's own tying across stages starts on CUDA."""
    import_megatron()
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    cuda = torch.cuda.is_available()
    config = TransformerConfig(
        num_layers=arch.layers,
        hidden_size=arch.hidden,
        num_attention_heads=arch.heads,
        num_query_groups=arch.groups,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.ffn,
        normalization="RMSNorm",
        layernorm_epsilon=arch.eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=size,
        pipeline_model_parallel_size=stages,
        pipeline_dtype=torch.float32,  # what stages send each other (Gyre sends float32 hidden states itself)
        params_dtype=torch.float32,
        use_cpu_initialization=not cuda,
        perform_initialization=False,  # the checkpoint's weights are loaded next
        gradient_accumulation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        cuda_graph_scope=[],  # the default ("full") warns as deprecated
    )
    spec = get_gpt_layer_local_spec(qk_layernorm=arch.qk_norm, normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = SegmentAttention
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=arch.vocab,
        max_sequence_length=arch.max_positions,
        position_embedding_type="rope",
        rotary_base=int(arch.rope_theta) if float(arch.rope_theta).is_integer() else arch.rope_theta,
        share_embeddings_and_output_weights=arch.tied and stages == 1,
        parallel_output=True,
        pre_process=stage == 0,
        post_process=stage == stages - 1,
    )
    model.gyre_arch = arch  # what the forward needs beyond Megatron's config (the padding row)
    return model.train()


def token_logprobs_and_entropy(
    model: Any, micro: MicroStep, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token of ``micro`` with loss weight > 0: log p(token | its ancestors) at ``temperature`` and the entropy
    of the distribution it was drawn from (no gradient), 0 elsewhere and where a sequence starts; the same contract
    as the torch backend's. For a model of one pipeline stage; `gyre.train.megatron.member` runs the stages of a
    pipelined one."""
    pieces, entropies = [], []
    start = 0
    for ids, positions, parents in sequences(micro):
        wanted = [w > 0 for w in micro.weights[start : start + len(ids)]]
        start += len(ids)
        lp, ent = head(model, decode(model, ids, positions, parents), ids, parents, temperature, wanted)
        pieces.append(lp)
        entropies.append(ent)
    if not pieces:
        empty = torch.zeros(0)
        return empty, empty
    return torch.cat(pieces), torch.cat(entropies)


def sequences(micro: MicroStep) -> list[tuple[list[int], list[int], list[int]]]:
    """Each sequence of a packed micro-step: its input ids, positions and parents (indices within it)."""
    return [
        (
            micro.input_ids[start:end],
            micro.position_ids[start:end],
            [p - start if p >= 0 else -1 for p in micro.parents[start:end]],
        )
        for start, end in sequence_bounds(micro.parents)
    ]


def _rotary(model: Any, positions: torch.Tensor) -> torch.Tensor:
    """Megatron's rotary embedding (``[n, 1, 1, dim]``, halves not interleaved) at arbitrary positions."""
    inv_freq = model.rotary_pos_emb.inv_freq.to(positions.device)
    freqs = positions.to(inv_freq.dtype)[:, None] * inv_freq[None, :]
    return torch.cat([freqs, freqs], dim=-1)[:, None, None, :]


def decode(
    model: Any,
    input_ids: list[int],
    position_ids: list[int],
    parents: list[int],
    hidden: torch.Tensor | None = None,
) -> torch.Tensor:
    """This stage's part of one sequence: its layers over ``hidden`` (``[n, 1, hidden]``, the previous stage's
    output; the first stage embeds ``input_ids`` instead), and the final norm on the last stage."""
    arch: Architecture = model.gyre_arch
    device = next(model.parameters()).device
    positions = torch.tensor(position_ids, device=device)
    if model.pre_process:
        ids = torch.tensor([input_ids], device=device)
        hidden = model.embedding(input_ids=ids, position_ids=positions[None])  # [n, 1, hidden]
        if arch.pad is not None:  # transformers never trains the padding row's lookup (padding_idx)
            hidden = torch.where((ids[0] == arch.pad)[:, None, None], hidden.detach(), hidden)
    else:
        model.decoder.set_input_tensor(hidden)
    chain = all(p == i - 1 for i, p in enumerate(parents))
    token = _segments.set(None if chain else tree_segments(parents))
    try:
        rotary = _rotary(model, positions)
        out: torch.Tensor = model.decoder(hidden_states=hidden, attention_mask=None, rotary_pos_emb=rotary)
    finally:
        _segments.reset(token)
    return out


def head(
    model: Any,
    hidden: torch.Tensor,
    input_ids: list[int],
    parents: list[int],
    temperature: float,
    wanted: list[bool] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The last stage's output layer over one sequence's final hidden states: per token ``wanted`` (default: all),
    its log-probability from its parent's logits and that distribution's entropy (0 elsewhere and where the sequence
    starts). Logits are made for those tokens only."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    device = hidden.device
    ids = torch.tensor(input_ids, device=device)
    weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
    rows = [i for i, p in enumerate(parents) if p >= 0 and (wanted is None or wanted[i])]
    scored = torch.tensor(rows, device=device, dtype=torch.long)
    source_rows = torch.tensor([parents[i] for i in rows], device=device, dtype=torch.long)
    # [rows, 1, vocab / tp]; every tensor-parallel rank has the same rows (none: empty collectives, and the loss
    # still reaches hidden)
    logits, _ = model.output_layer(hidden.index_select(0, source_rows), weight=weight)
    source = logits.float() / temperature  # the logits each scored token was drawn from
    picked = -vocab_parallel_cross_entropy(source.clone(), ids[scored, None])[:, 0]
    with torch.no_grad():
        group = parallel_state.get_tensor_model_parallel_group()
        size = parallel_state.get_tensor_model_parallel_world_size()
        top = source.max(-1, keepdim=True).values
        if size > 1:
            torch.distributed.all_reduce(top, op=torch.distributed.ReduceOp.MAX, group=group)
        shifted = source - top
        exp = shifted.exp()
        sums = torch.stack([exp.sum(-1), (exp * shifted).sum(-1)])
        if size > 1:
            torch.distributed.all_reduce(sums, group=group)
        entropy = (sums[0].log() - sums[1] / sums[0])[:, 0]  # H = log Z - E[x - max]
    zero = torch.zeros(len(parents), device=device, dtype=picked.dtype)
    return zero.index_put((scored,), picked), zero.index_put((scored,), entropy)

"""Hugging Face <-> Megatron-core weights for Qwen3, Qwen2 and Llama checkpoints, sharded for tensor parallelism.

Gyre's own mapping (no bridge installs here for Python 3.11 with megatron-core 0.16). Every conversion is a
permutation of values: concatenations, splits and reshapes, never arithmetic, so HF -> Megatron -> HF is exact and a
gradient maps the way its weight does. How each HF tensor lands in a rank's shard:

- ``q_proj``, ``k_proj``, ``v_proj`` -> ``linear_qkv``: per query group, that group's query heads, then its key head,
  then its value head (Megatron's interleaved layout); rank ``r`` of ``t`` holds groups ``[r g/t, (r+1) g/t)``.
  Biases (Qwen2) the same way.
- ``gate_proj``, ``up_proj`` -> ``linear_fc1``: rank ``r`` holds its slice of ``gate`` followed by its slice of ``up``.
- ``o_proj`` -> ``linear_proj`` and ``down_proj`` -> ``linear_fc2``: split along the input dimension.
- ``embed_tokens`` and ``lm_head`` (unless tied): split along the vocabulary.
- norms (``input_layernorm``, ``post_attention_layernorm``, ``norm``, ``q_norm``, ``k_norm``): whole on every rank.
- pipeline stages: stage ``s`` of ``p`` holds layers ``[s L/p, (s+1) L/p)``, numbered from 0; the first holds the
  embedding, the last the final norm and the output layer (a tied one as its own copy of the embedding).

Gradients of ``q_norm``/``k_norm`` are partial on each rank (each sees only its own heads) and are summed when
gathered; the other norms' gradients are complete on every rank (their outputs feed layers whose backward sums over
the group), so rank 0's is taken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from gyre.errors import ConfigError

ARCHITECTURES = ("qwen3", "qwen2", "llama")


@dataclass(frozen=True)
class Architecture:
    """What a Megatron model of a Hugging Face checkpoint needs to know (from its ``config.json``)."""

    model_type: str
    layers: int
    hidden: int
    heads: int
    groups: int  # key/value heads
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool
    eps: float
    rope_theta: float
    max_positions: int
    pad: int | None = None  # the embedding's padding_idx in transformers: that row's lookup gets no gradient

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> Architecture:
        """The architecture of a ``config.json``; refuses what the mapping does not cover, saying what."""
        kind = config.get("model_type", "")
        if kind not in ARCHITECTURES:
            raise ConfigError(
                f"trainer.backend = 'megatron' converts {', '.join(ARCHITECTURES)} checkpoints; this one is {kind!r}"
            )
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
            raise ConfigError(
                f"rope scaling {rope.get('rope_type')!r} is not mapped to Megatron (only plain RoPE)"
            )
        if config.get("mlp_bias"):
            raise ConfigError("MLP biases are not mapped to Megatron")
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        qkv_bias = kind == "qwen2" or bool(config.get("attention_bias"))
        if kind == "llama" and config.get("attention_bias"):
            raise ConfigError("Llama attention biases (o_proj's too) are not mapped to Megatron")
        return cls(
            model_type=kind,
            layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            heads=heads,
            groups=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            ffn=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
            tied=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            qk_norm=kind == "qwen3",
            eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0),
            max_positions=int(config.get("max_position_embeddings", 32768)),
            pad=None if config.get("pad_token_id") is None else int(config["pad_token_id"]),
        )

    def check_split(self, size: int, stages: int = 1) -> None:
        """Refuse a tensor-parallel size, or a number of pipeline stages, the model's dimensions do not divide."""
        for what, n in (
            ("key/value heads", self.groups),
            ("intermediate size", self.ffn),
            ("vocabulary", self.vocab),
        ):
            if n % size:
                raise ConfigError(f"tensor_parallel = {size} does not divide the model's {what} ({n})")
        if self.layers % stages:
            raise ConfigError(
                f"pipeline_parallel = {stages} does not divide the model's {self.layers} layers"
            )

    def stage_layers(self, stage: int, stages: int) -> range:
        """The (global) layers pipeline stage ``stage`` of ``stages`` holds."""
        per = self.layers // stages
        return range(stage * per, (stage + 1) * per)


def _layer(i: int, local: int | None = None) -> tuple[str, str]:
    return f"model.layers.{i}.", f"decoder.layers.{i if local is None else local}."


def _interleave_qkv(arch: Architecture, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[q heads of group 0, k 0, v 0, q heads of group 1, ...] along dim 0 (weights or biases)."""
    per = arch.heads // arch.groups
    rest = q.shape[1:]
    q = q.reshape(arch.groups, per * arch.head_dim, *rest)
    k = k.reshape(arch.groups, arch.head_dim, *rest)
    v = v.reshape(arch.groups, arch.head_dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def _split_qkv(arch: Architecture, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    per = arch.heads // arch.groups
    rest = qkv.shape[1:]
    grouped = qkv.reshape(arch.groups, (per + 2) * arch.head_dim, *rest)
    q, k, v = grouped.split([per * arch.head_dim, arch.head_dim, arch.head_dim], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def to_megatron(
    hf: dict[str, torch.Tensor],
    arch: Architecture,
    rank: int = 0,
    size: int = 1,
    stage: int = 0,
    stages: int = 1,
) -> dict[str, torch.Tensor]:
    """Tensor rank ``rank``'s shard (of ``size``) of pipeline stage ``stage`` (of ``stages``) of a Hugging Face
    state dict, under Megatron-core's names (a stage numbers its layers from 0). The first stage holds the embedding,
    the last the final norm and the output layer; with more than one stage a tied output layer is the last stage's own
    copy of the embedding (its gradient is added to the embedding's when gathered)."""
    arch.check_split(size, stages)

    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(size, dim=0)[rank]

    def cols(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(size, dim=1)[rank]

    out: dict[str, torch.Tensor] = {}
    if stage == 0:
        out["embedding.word_embeddings.weight"] = rows(hf["model.embed_tokens.weight"])
    layers = arch.stage_layers(stage, stages)
    for i in layers:
        h, m = _layer(i, i - layers.start)
        attn = h + "self_attn."
        out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
        for kind in ("weight", "bias") if arch.qkv_bias else ("weight",):
            qkv = _interleave_qkv(arch, *(hf[f"{attn}{p}_proj.{kind}"] for p in "qkv"))
            out[f"{m}self_attention.linear_qkv.{kind}"] = rows(qkv)
        if arch.qk_norm:
            out[m + "self_attention.q_layernorm.weight"] = hf[attn + "q_norm.weight"]
            out[m + "self_attention.k_layernorm.weight"] = hf[attn + "k_norm.weight"]
        out[m + "self_attention.linear_proj.weight"] = cols(hf[attn + "o_proj.weight"])
        out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
        gate, up = hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]
        out[m + "mlp.linear_fc1.weight"] = torch.cat([rows(gate), rows(up)])
        out[m + "mlp.linear_fc2.weight"] = cols(hf[h + "mlp.down_proj.weight"])
    if stage == stages - 1:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
        if not arch.tied:
            out["output_layer.weight"] = rows(hf["lm_head.weight"])
        elif stages > 1:
            out["output_layer.weight"] = rows(hf["model.embed_tokens.weight"])
    return out


def to_hf(
    shards: list[dict[str, torch.Tensor]], arch: Architecture, gradients: bool = False, stages: int = 1
) -> dict[str, torch.Tensor]:
    """The Hugging Face state dict of every rank's shard, in Megatron's rank order (stage by stage, tensor ranks
    within each); ``gradients``: sum the partial ones (per-head norms, a tied output layer's copy)."""
    size = len(shards) // stages
    by_stage = [shards[s * size : (s + 1) * size] for s in range(stages)]

    def rows(group: list[dict[str, torch.Tensor]], name: str) -> torch.Tensor:
        return torch.cat([s[name] for s in group], dim=0)

    def cols(group: list[dict[str, torch.Tensor]], name: str) -> torch.Tensor:
        return torch.cat([s[name] for s in group], dim=1)

    def partial(group: list[dict[str, torch.Tensor]], name: str) -> torch.Tensor:
        return sum((s[name] for s in group[1:]), group[0][name].clone()) if gradients else group[0][name]

    first, last = by_stage[0], by_stage[-1]
    embedding = rows(first, "embedding.word_embeddings.weight")
    if arch.tied and stages > 1 and gradients:  # the output layer's copy learns from the logits
        embedding = embedding + rows(last, "output_layer.weight")
    out = {"model.embed_tokens.weight": embedding}
    for s, group in enumerate(by_stage):
        layers = arch.stage_layers(s, stages)
        for i in layers:
            h, m = _layer(i, i - layers.start)
            attn = h + "self_attn."
            out[h + "input_layernorm.weight"] = group[0][m + "input_layernorm.weight"]
            for kind in ("weight", "bias") if arch.qkv_bias else ("weight",):
                q, k, v = _split_qkv(arch, rows(group, f"{m}self_attention.linear_qkv.{kind}"))
                out[f"{attn}q_proj.{kind}"], out[f"{attn}k_proj.{kind}"], out[f"{attn}v_proj.{kind}"] = (
                    q,
                    k,
                    v,
                )
            if arch.qk_norm:
                out[attn + "q_norm.weight"] = partial(group, m + "self_attention.q_layernorm.weight")
                out[attn + "k_norm.weight"] = partial(group, m + "self_attention.k_layernorm.weight")
            out[attn + "o_proj.weight"] = cols(group, m + "self_attention.linear_proj.weight")
            out[h + "post_attention_layernorm.weight"] = group[0][m + "pre_mlp_layernorm.weight"]
            halves = [g[m + "mlp.linear_fc1.weight"].chunk(2, dim=0) for g in group]
            out[h + "mlp.gate_proj.weight"] = torch.cat([gate for gate, _ in halves])
            out[h + "mlp.up_proj.weight"] = torch.cat([up for _, up in halves])
            out[h + "mlp.down_proj.weight"] = cols(group, m + "mlp.linear_fc2.weight")
    out["model.norm.weight"] = last[0]["decoder.final_layernorm.weight"]
    if not arch.tied:
        out["lm_head.weight"] = rows(last, "output_layer.weight")
    return out


def hf_layout(config: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of a Hugging Face model's trained parameters in ``named_parameters`` order: the layout of the
    flat weights and gradients every member exchanges with the core (built on the meta device, no memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    return [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad]


def unflatten(flat: torch.Tensor, layout: list[tuple[str, tuple[int, ...]]]) -> dict[str, torch.Tensor]:
    """Views of ``flat`` by name (``layout`` as `hf_layout` gives it)."""
    out, offset = {}, 0
    for name, shape in layout:
        n = math.prod(shape)
        out[name] = flat[offset : offset + n].view(shape)
        offset += n
    if offset != flat.numel():
        raise ValueError(f"{flat.numel()} values for a layout of {offset}")
    return out


def flatten(tensors: dict[str, torch.Tensor], layout: list[tuple[str, tuple[int, ...]]]) -> torch.Tensor:
    """One vector of ``tensors`` in ``layout`` order."""
    return torch.cat([tensors[name].reshape(-1) for name, _ in layout])

"""Hugging Face <-> Megatron-core weight conversion: exact round trips, shards laid out as Megatron splits them."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gyre.errors import ConfigError
from gyre.train.megatron import convert

BASE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 16, "vocab_size": 48, "max_position_embeddings": 512}  # fmt: skip
CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3-tied": {**BASE, "model_type": "qwen3", "tie_word_embeddings": True},
    "qwen2-bias": {**BASE, "model_type": "qwen2", "tie_word_embeddings": False},
    "llama": {**BASE, "model_type": "llama", "tie_word_embeddings": False},
}


def random_state(config: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) for name, shape in convert.hf_layout(config)}


@pytest.mark.parametrize("kind", sorted(CONFIGS))
@pytest.mark.parametrize("size,stages", [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2)])
def test_hf_to_megatron_to_hf_is_exact_for_every_parallel_layout(kind: str, size: int, stages: int) -> None:
    config = CONFIGS[kind]
    arch = convert.Architecture.from_hf(config)
    hf = random_state(config)
    shards = [convert.to_megatron(hf, arch, r % size, size, r // size, stages) for r in range(size * stages)]
    back = convert.to_hf(shards, arch, stages=stages)
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name
    layout = convert.hf_layout(config)
    flat = convert.flatten(hf, layout)
    assert torch.equal(convert.flatten(convert.to_hf(shards, arch, stages=stages), layout), flat)
    assert all(torch.equal(v, hf[k]) for k, v in convert.unflatten(flat, layout).items())


def test_shards_hold_whole_query_groups_and_their_own_gate_and_up_slices() -> None:
    config = CONFIGS["qwen2-bias"]
    arch = convert.Architecture.from_hf(config)
    hf = random_state(config)
    rank1 = convert.to_megatron(hf, arch, rank=1, size=2)
    qkv = rank1["decoder.layers.0.self_attention.linear_qkv.weight"]
    d, per = 16, 2  # head_dim, query heads per group
    assert qkv.shape == ((per + 2) * d * 2, 64)  # two of the four groups
    q = hf["model.layers.0.self_attn.q_proj.weight"]
    k = hf["model.layers.0.self_attn.k_proj.weight"]
    assert torch.equal(qkv[: per * d], q[2 * per * d : 3 * per * d])  # group 2's query heads come first
    assert torch.equal(qkv[per * d : (per + 1) * d], k[2 * d : 3 * d])  # then group 2's key head
    bias = rank1["decoder.layers.0.self_attention.linear_qkv.bias"]
    assert torch.equal(bias[: per * d], hf["model.layers.0.self_attn.q_proj.bias"][2 * per * d : 3 * per * d])
    fc1 = rank1["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(fc1[:48], hf["model.layers.0.mlp.gate_proj.weight"][48:])
    assert torch.equal(fc1[48:], hf["model.layers.0.mlp.up_proj.weight"][48:])
    assert torch.equal(rank1["output_layer.weight"], hf["lm_head.weight"][24:])


def test_gathered_gradients_sum_the_per_head_norms_and_take_whole_norms_once() -> None:
    config = CONFIGS["qwen3-tied"]
    arch = convert.Architecture.from_hf(config)
    hf = random_state(config)
    shards = [convert.to_megatron(hf, arch, rank, 2) for rank in range(2)]
    grads = convert.to_hf(shards, arch, gradients=True)
    name = "model.layers.1.self_attn.q_norm.weight"
    assert torch.equal(grads[name], 2 * hf[name])  # each rank's partial gradient counts
    assert torch.equal(grads["model.norm.weight"], hf["model.norm.weight"])  # complete on every rank: once


def test_pipeline_stages_number_their_layers_from_zero_and_the_last_holds_a_tied_heads_copy() -> None:
    config = CONFIGS["qwen3-tied"]
    arch = convert.Architecture.from_hf(config)
    hf = random_state(config)
    first, last = (convert.to_megatron(hf, arch, 0, 1, stage, 2) for stage in (0, 1))
    assert "embedding.word_embeddings.weight" in first and "output_layer.weight" not in first
    assert "embedding.word_embeddings.weight" not in last and "decoder.final_layernorm.weight" in last
    w = "decoder.layers.0.self_attention.linear_proj.weight"
    assert torch.equal(last[w], hf["model.layers.1.self_attn.o_proj.weight"])  # global layer 1 is stage 1's 0
    assert torch.equal(last["output_layer.weight"], hf["model.embed_tokens.weight"])
    grads = convert.to_hf([first, last], arch, gradients=True, stages=2)
    assert torch.equal(grads["model.embed_tokens.weight"], 2 * hf["model.embed_tokens.weight"])  # both uses


def test_what_the_mapping_does_not_cover_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match="'gpt2'"):
        convert.Architecture.from_hf({**BASE, "model_type": "gpt2"})
    with pytest.raises(ConfigError, match="rope scaling 'llama3'"):
        convert.Architecture.from_hf(
            {**CONFIGS["llama"], "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
        )
    arch = convert.Architecture.from_hf(CONFIGS["llama"])
    with pytest.raises(
        ConfigError, match=r"tensor_parallel = 8 does not divide the model's key/value heads \(4\)"
    ):
        arch.check_split(8)

"""The long-context step budget (`gyre.train.budget`) against cases counted by hand."""

from __future__ import annotations

import pytest

from gyre.train.budget import causal_pairs, step_budget, tree_pairs
from gyre.train.memory import BF16

# 1 layer, hidden 4, one head of 4, intermediate 8, vocabulary 10, tied: matrices per layer q,k,v 3 x 16, o 16,
# MLP 3 x 32 = 160; parameters 160 + norms (2 x 4 + q/k norms 2 x 4) + embedding 40 + final norm 4 = 220
TOY = {"model_type": "qwen3", "hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 1,
       "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 8, "vocab_size": 10,
       "tie_word_embeddings": True}  # fmt: skip


def test_pairs_of_a_chain_and_a_tree() -> None:
    assert causal_pairs(6) == 21
    # a root, a chain of 2 under it and a branch of 1 from the root: depths 0, 1, 2, 1
    assert tree_pairs([-1, 0, 1, 0]) == 0 + 1 + 2 + 1 + 4


def test_flops_split_into_the_linear_and_the_quadratic_term() -> None:
    b = step_budget(TOY, 6, scored_tokens=5)
    assert b.linear_flops == 6 * 160 * 6 + 8 * 40 * 5  # layers fwd+bwd; lm head fwd, recomputed, bwd
    assert b.attention_flops == 12 * 21 * 4  # 21 causal pairs x (QK + PV) x head_dim, x 3 for backward
    ckpt = step_budget(TOY, 6, scored_tokens=5, checkpointing=True)
    assert ckpt.linear_flops == 8 * 160 * 6 + 8 * 40 * 5 and ckpt.attention_flops == 16 * 21 * 4
    four = step_budget(TOY, 6, cp=4, scored_tokens=5)
    assert four.flops == b.flops and four.flops_per_rank == b.flops / 4  # the same work, shared
    assert b.seconds(1000.0, 100.0) == pytest.approx(7360 / 1000 + 1008 / 100)


def test_memory_per_rank_by_term_fp32_one_rank_and_two() -> None:
    one = step_budget(TOY, 6)
    assert one.memory == {
        "weights": 220 * 4,
        "gradients": 220 * 4 + 220 * 8,  # the local fp32 gradient and the core's float64 step sum
        "master": 0,
        "moments": 220 * 2 * 4,
        # 7h + 2(q + 2kv) + q + 4i = 88 values; fp32: 2 norms' rsqrt, a log-sum-exp, q and k norms' rsqrt
        "activations": 6 * (88 * 4 + 5 * 4),
        "keys_values": 0,
        "logits": 6 * 10 * 8
        + 6 * 4 * 4,  # a (whole) chunk of logits and its gradient; the final hidden states
    }
    two = step_budget(TOY, 6, cp=2)
    assert two.memory["activations"] == 3 * (88 * 4 + 5 * 4)
    # ring attention: two blocks of a rank's 3 tokens' k and v in flight, and in backward their two fp32 gradients
    assert two.memory["keys_values"] == 4 * (3 * 2 * 4) * 4
    assert two.memory["logits"] == 3 * 10 * 8 + 3 * 4 * 4
    assert two.step_bytes == two.memory_bytes - 880
    scored = step_budget(TOY, 6, scored_tokens=2)  # logits only for the tokens a loss reads
    assert scored.memory["logits"] == 2 * 10 * 8 + 6 * 4 * 4


def test_checkpointing_keeps_a_hidden_state_a_layer_and_one_layer_recomputed() -> None:
    b = step_budget(TOY, 6, checkpointing=True)
    assert b.memory["activations"] == 6 * (4 * 4 + 88 * 4 + 5 * 4)


def test_the_optimizer_state_shards_over_the_cell() -> None:
    b = step_budget(TOY, 6, precision=BF16, optimizer_shards=4)
    assert b.memory["weights"] == 220 * 2 and b.memory["master"] == 55 * 4 and b.memory["moments"] == 55 * 8
    assert (
        b.memory["gradients"] == 220 * 2 + 55 * 4
    )  # ZeRO-1: the local bf16 gradient whole, the fp32 sum split
    fsdp = step_budget(TOY, 6, precision=BF16, optimizer_shards=4, full_shard=True)
    assert fsdp.memory["weights"] == 55 * 2 + 2 * 176 * 2  # a quarter, plus two whole layers gathered
    assert fsdp.memory["gradients"] == 55 * 2 + 55 * 4


def test_qwen3_8b_at_700k_on_eight_ranks_fits_only_fully_sharded_with_checkpointing() -> None:
    config = {"model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
              "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
              "tie_word_embeddings": False}  # fmt: skip
    kwargs = {"cp": 8, "precision": BF16, "optimizer_shards": 8, "scored_tokens": 100_000}
    with_ckpt = step_budget(config, 700_000, checkpointing=True, full_shard=True, **kwargs)
    without = step_budget(config, 700_000, checkpointing=False, full_shard=True, **kwargs)
    zero1 = step_budget(config, 700_000, checkpointing=True, **kwargs)
    assert with_ckpt.fits() and not without.fits() and not zero1.fits()
    assert with_ckpt.attention_flops > 5 * with_ckpt.linear_flops  # at 700K the quadratic term dominates


def test_the_logits_chunk_is_the_loss_code_s() -> None:
    from gyre.train import budget, loss

    assert budget.LOGITS_CHUNK_BYTES == loss.LOGITS_CHUNK_BYTES

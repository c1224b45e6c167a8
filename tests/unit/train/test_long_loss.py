"""Chunked log-probabilities equal the whole-vocabulary path, only the tokens a loss reads are scored; the micro
preset builds, runs and takes any id."""

from __future__ import annotations

import math

import msgspec
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from gyre.config import LossConfig
from gyre.engine.models import init_model, load_tokenizer
from gyre.protocol import MicroStep
from gyre.train import loss
from gyre.train.objective import compute_gradients, policy_loss


def _whole_logprobs(model, micro, temperature):  # today's path before chunking: every token's logits at once
    out = []
    for start, end in loss.sequence_bounds(micro.parents):
        parents = [p - start if p >= 0 else -1 for p in micro.parents[start:end]]
        ids = torch.tensor([micro.input_ids[start:end]])
        positions = torch.tensor([micro.position_ids[start:end]])
        chain = all(p == i - 1 for i, p in enumerate(parents))
        token = loss._segments.set(loss.tree_segments(parents))
        previous = model.config._attn_implementation
        if not chain:
            model.set_attn_implementation(loss.TREE_ATTENTION)
        try:
            logits = model(input_ids=ids, position_ids=positions).logits[0]
        finally:
            model.set_attn_implementation(previous)
            loss._segments.reset(token)
        index = torch.tensor(parents)
        dtype = torch.promote_types(logits.dtype, torch.float32)
        source = (logits[index.clamp(min=0)].to(dtype) / temperature).log_softmax(-1)
        picked = source.gather(-1, ids[0, :, None]).squeeze(-1)
        out.append(torch.where(index >= 0, picked, torch.zeros_like(picked)))
    return torch.cat(out)


def _micro_step(vocab: int) -> MicroStep:
    g = torch.Generator().manual_seed(0)
    chain = list(range(-1, 39))
    tree = [-1, *range(0, 19), 9, *range(20, 29), 4, 30, 31]  # branches at tokens 9 and 4
    parents = chain + [p + 40 if p >= 0 else -1 for p in tree]
    depth: list[int] = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    ids = torch.randint(0, vocab, (len(parents),), generator=g).tolist()
    n = len(parents)
    return MicroStep(
        input_ids=ids,
        position_ids=depth,
        parents=parents,
        weights=[1.0] * n,
        advantages=[0.0] * n,
        behaviour_logprobs=[0.0] * n,
        versions=[0] * n,
        sequences=2,
    )


def test_chunked_logprobs_and_gradients_equal_the_whole_vocabulary(tmp_path, monkeypatch):
    model = AutoModelForCausalLM.from_pretrained(init_model(tmp_path / "m", "micro"), dtype=torch.float64)
    micro = _micro_step(model.config.vocab_size)
    # many chunks of 7 tokens, one ragged
    monkeypatch.setattr(loss, "LOGITS_CHUNK_BYTES", 7 * 4 * model.config.vocab_size)
    for temperature in (1.0, 0.7):
        model.zero_grad()
        expected = _whole_logprobs(model, micro, temperature)
        expected.sum().backward()
        want = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        got, entropy = loss.token_logprobs_and_entropy(model, micro, temperature)
        got.sum().backward()
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
        for n, p in model.named_parameters():
            # sums in another order: within 1e-6 of the gradient's scale
            error, scale = (p.grad - want[n]).abs().max().item(), want[n].abs().max().item()
            assert error <= 1e-6 * max(scale, 1.0), (n, error, scale)
        assert entropy.shape == got.shape and bool((entropy[torch.tensor(micro.parents) >= 0] > 0).all())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_lm_head_in_chunks_equals_log_softmax_in_value_entropy_and_every_gradient(
    temperature: float, with_bias: bool
) -> None:
    g = torch.Generator().manual_seed(1)
    n, vocab, dim = 37, 1001, 8  # 37 tokens in chunks of 7: five whole, one ragged
    hidden = torch.randn(n, dim, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, dim, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(vocab, generator=g, dtype=torch.float64, requires_grad=True) if with_bias else None
    targets = torch.randint(0, vocab, (n,), generator=g)
    upstream = torch.randn(
        n, generator=g, dtype=torch.float64
    )  # any loss of the logprobs, not only their sum
    inputs = [hidden, weight, *([bias] if bias is not None else [])]

    got, entropy = loss.chunked_logprobs(hidden, weight, bias, targets, temperature, chunk_tokens=7)
    got_grads = torch.autograd.grad((got * upstream).sum(), inputs)
    whole = (F.linear(hidden, weight, bias) / temperature).log_softmax(-1)
    want = whole.gather(-1, targets[:, None])[:, 0]
    want_grads = torch.autograd.grad((want * upstream).sum(), inputs)

    assert got.dtype == torch.float64 and not entropy.requires_grad
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(entropy, -(whole.exp() * whole).sum(-1).detach(), atol=1e-6, rtol=0)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_no_tokens_to_score_still_gives_the_hidden_states_a_gradient() -> None:
    hidden = torch.randn(5, 4, requires_grad=True)
    weight = torch.randn(11, 4, requires_grad=True)
    picked, _ = loss.chunked_logprobs(hidden[:0], weight, None, torch.zeros(0, dtype=torch.long), 1.0)
    picked.sum().backward()  # a context-parallel rank with nothing to score still runs every layer's backward
    assert hidden.grad is not None and weight.grad is not None and not hidden.grad.any()


def _with_context(micro: MicroStep) -> MicroStep:
    """``micro`` with loss weight on one token in 7 (an agent's generated tokens), its others context."""
    weights = [1.0 / 7 if i % 7 == 3 else 0.0 for i in range(len(micro.input_ids))]
    return msgspec.structs.replace(micro, weights=weights, advantages=[1.0] * len(weights))


def test_only_weighted_tokens_get_logits_and_the_loss_and_gradients_are_unchanged(tmp_path, monkeypatch):
    model = AutoModelForCausalLM.from_pretrained(init_model(tmp_path / "m", "micro"), dtype=torch.float64)
    micro = _with_context(_micro_step(model.config.vocab_size))
    weighted = torch.tensor(micro.weights) > 0
    rows: list[int] = []
    head = loss.chunked_logprobs

    def counted(hidden, *args, **kwargs):
        rows.append(hidden.shape[0])
        return head(hidden, *args, **kwargs)

    monkeypatch.setattr(loss, "chunked_logprobs", counted)
    every = loss.token_logprobs(model, micro, scored=loss.every_token(micro))
    assert sum(rows) == len(micro.input_ids) - micro.sequences  # every token with a parent
    rows.clear()
    model.zero_grad()
    policy_loss(every, micro).backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    got, entropy = loss.token_logprobs_and_entropy(model, micro)
    policy_loss(got, micro).backward()

    assert (
        sum(rows) == int(weighted.sum()) < len(micro.input_ids) / 6
    )  # the lm head saw the weighted tokens only
    torch.testing.assert_close(got[weighted], every[weighted], atol=1e-12, rtol=0)
    assert not got[~weighted].any() and not entropy[~weighted].any()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], atol=1e-12, rtol=0)


def test_a_context_tokens_recorded_logprob_does_not_reach_the_loss(tmp_path):
    model = AutoModelForCausalLM.from_pretrained(init_model(tmp_path / "m", "micro"), dtype=torch.float32)
    micro = _with_context(_micro_step(model.config.vocab_size))
    # a context token whose recorded logprob is far from the model's (e.g. a tool output's placeholder): its ratio
    # would overflow, and 0 weight x inf is NaN
    behaviour = [-500.0 if w == 0 else 0.0 for w in micro.weights]
    stats = compute_gradients(
        model, msgspec.structs.replace(micro, behaviour_logprobs=behaviour), LossConfig(), 0
    )
    assert math.isfinite(stats.loss) and stats.tokens == sum(1 for w in micro.weights if w > 0)
    assert all(bool(p.grad.isfinite().all()) for p in model.parameters() if p.grad is not None)


def test_micro_preset_has_qwen_vocabulary_and_its_tokenizer_still_works(tmp_path):
    path = init_model(tmp_path / "m", "micro")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = load_tokenizer(path)
    c = model.config
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (1, 1, 1, 16)
    assert c.vocab_size == 151936 > len(tokenizer)
    ids = tokenizer("hello, world")["input_ids"]
    assert tokenizer.decode(ids) == "hello, world"
    out = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)
    assert out.shape[1] == len(ids) + 4

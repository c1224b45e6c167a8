"""Chunked log-probabilities equal the whole-vocabulary path; the micro preset builds, runs and takes any id."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from gyre.models import init_model, load_tokenizer
from gyre.protocol import MicroStep
from gyre.train import loss


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
        source = (logits[index.clamp(min=0)].float() / temperature).log_softmax(-1)
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


def testchunked_logprobs_and_gradients_equal_the_whole_vocabulary(tmp_path, monkeypatch):
    model = AutoModelForCausalLM.from_pretrained(init_model(tmp_path / "m", "micro"), dtype=torch.float64)
    micro = _micro_step(model.config.vocab_size)
    monkeypatch.setattr(loss, "LOGITS_CHUNK_TOKENS", 7)  # many chunks, one ragged
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
            # fp32 sums in another order: within 1e-6 of the gradient's scale
            error, scale = (p.grad - want[n]).abs().max().item(), want[n].abs().max().item()
            assert error <= 1e-6 * max(scale, 1.0), (n, error, scale)
        assert entropy.shape == got.shape and bool((entropy[torch.tensor(micro.parents) >= 0] > 0).all())


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

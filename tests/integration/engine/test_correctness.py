"""The embedded engine computes what the model computes: greedy tokens, logprobs, cache and batching invariance."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from gyre.config import EngineConfig
from gyre.engine.embedded.asyncengine import EmbeddedEngine
from gyre.protocol import GenerateRequest, GenerateResponse, SamplingParams
from reference import hf_greedy, hf_logprobs

GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randrange(3, 60))] for _ in range(n)]


def _run(engine: EmbeddedEngine, reqs: list[GenerateRequest]) -> list[GenerateResponse]:
    async def go() -> list[GenerateResponse]:
        return list(await asyncio.gather(*(engine.generate(r) for r in reqs)))

    return asyncio.run(go())


def test_greedy_matches_hugging_face_generate_token_for_token(engine: EmbeddedEngine, hf_model: Any) -> None:
    prompts = _prompts(6)
    outs = _run(engine, [GenerateRequest(input_ids=p, sampling_params=GREEDY) for p in prompts])
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.output_ids == hf_greedy(hf_model, prompt, 24)
        assert out.finish_type == "length"
        assert out.meta_info.prompt_tokens == len(prompt)
        assert out.meta_info.completion_tokens == 24


def test_logprobs_equal_teacher_forced_forward(engine: EmbeddedEngine, hf_model: Any) -> None:
    prompts = _prompts(4, seed=1)
    for temperature in (0.0, 1.0, 0.7):
        params = SamplingParams(max_new_tokens=20, temperature=temperature, ignore_eos=True, sampling_seed=3)
        reqs = [GenerateRequest(input_ids=p, sampling_params=params, return_logprob=True) for p in prompts]
        for prompt, out in zip(prompts, _run(engine, reqs), strict=True):
            ref = hf_logprobs(hf_model, prompt, out.output_ids, temperature or 1.0)
            assert len(out.output_logprobs) == len(out.output_ids) == 20
            assert max(abs(a - b) for a, b in zip(out.output_logprobs, ref, strict=True)) < 1e-4
            assert [t for _, t, _ in out.meta_info.output_token_logprobs or []] == out.output_ids


def test_prefix_cache_reuses_kv_without_changing_outputs(tiny_model: Path) -> None:
    base = _prompts(1, seed=7)[0] * 4
    follow_ups = [base + [i, i + 1, i + 2] for i in range(5)]

    def outputs(enable: bool) -> tuple[list[list[int]], list[int]]:
        eng = EmbeddedEngine(EngineConfig(model_path=str(tiny_model), enable_prefix_cache=enable))
        try:
            first = _run(eng, [GenerateRequest(input_ids=base, sampling_params=GREEDY)])[0]
            rest = _run(eng, [GenerateRequest(input_ids=f, sampling_params=GREEDY) for f in follow_ups])
            # a multi-turn agent resends its history with the reply and a new message
            turn = _run(
                eng, [GenerateRequest(input_ids=base + first.output_ids + [9, 9], sampling_params=GREEDY)]
            )
        finally:
            eng.close()
        outs = [first.output_ids] + [r.output_ids for r in rest] + [turn[0].output_ids]
        cached = [r.meta_info.cached_tokens for r in rest] + [turn[0].meta_info.cached_tokens]
        return outs, cached

    with_cache, cached = outputs(True)
    without_cache, uncached = outputs(False)
    assert with_cache == without_cache
    assert all(c >= len(base) - 1 for c in cached[:-1])
    assert cached[-1] == len(base) + 24 - 1  # the whole history except the last sampled token
    assert uncached == [0] * len(uncached)


def test_requests_join_a_running_batch_and_match_solo_runs(engine: EmbeddedEngine) -> None:
    prompts = _prompts(5, seed=3)
    solo = [
        _run(engine, [GenerateRequest(input_ids=p, sampling_params=GREEDY)])[0].output_ids for p in prompts
    ]

    async def staggered() -> list[GenerateResponse]:
        async def one(i: int) -> GenerateResponse:
            await asyncio.sleep(0.01 * i)  # arrive while others are decoding
            return await engine.generate(GenerateRequest(input_ids=prompts[i], sampling_params=GREEDY))

        return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))

    steps_before = engine.statistics().steps
    together = asyncio.run(staggered())
    assert [o.output_ids for o in together] == solo
    assert engine.statistics().steps - steps_before < 5 * 24  # they shared steps


def test_sampling_seed_reproduces_and_top_k_one_is_greedy(engine: EmbeddedEngine) -> None:
    prompt = _prompts(1, seed=11)[0]
    seeded = SamplingParams(max_new_tokens=30, temperature=1.0, sampling_seed=42, ignore_eos=True)
    a, b = _run(engine, [GenerateRequest(input_ids=prompt, sampling_params=seeded)] * 2)
    assert a.output_ids == b.output_ids
    other = SamplingParams(max_new_tokens=30, temperature=1.0, sampling_seed=43, ignore_eos=True)
    assert (
        _run(engine, [GenerateRequest(input_ids=prompt, sampling_params=other)])[0].output_ids != a.output_ids
    )
    top1 = SamplingParams(max_new_tokens=30, temperature=1.0, top_k=1, ignore_eos=True)
    greedy = SamplingParams(max_new_tokens=30, temperature=0.0, ignore_eos=True)
    t, g = _run(engine, [GenerateRequest(input_ids=prompt, sampling_params=p) for p in (top1, greedy)])
    assert t.output_ids == g.output_ids


def test_stop_conditions(engine: EmbeddedEngine) -> None:
    prompt = _prompts(1, seed=5)[0]
    free = _run(engine, [GenerateRequest(input_ids=prompt, sampling_params=GREEDY)])[0].output_ids
    stop_token = free[5]
    by_token = SamplingParams(
        max_new_tokens=24, temperature=0.0, stop_token_ids=[stop_token], ignore_eos=True
    )
    out = _run(engine, [GenerateRequest(input_ids=prompt, sampling_params=by_token)])[0]
    assert out.output_ids == free[: free.index(stop_token) + 1]  # the stop token is included, as SGLang does
    assert out.meta_info.finish_reason == {"type": "stop", "matched": stop_token}

    text = "Hello, wor"
    params = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
    full = _run(engine, [GenerateRequest(text=text, sampling_params=params)])[0]
    stop = full.text[3:6]
    if stop:
        with_stop = SamplingParams(max_new_tokens=24, temperature=0.0, stop=stop, ignore_eos=True)
        out = _run(engine, [GenerateRequest(text=text, sampling_params=with_stop)])[0]
        assert out.meta_info.finish_reason == {"type": "stop", "matched": stop}
        assert out.text == full.text[: full.text.find(stop)]
    short = SamplingParams(max_new_tokens=3, temperature=0.0, ignore_eos=True)
    out = _run(engine, [GenerateRequest(input_ids=prompt, sampling_params=short)])[0]
    assert out.meta_info.finish_reason == {"type": "length", "length": 3}


@pytest.mark.slow(
    reason="a statistical test over thousands of samples (8 s); the fast tier checks greedy token for token"
)
def test_sampled_tokens_follow_the_model_distribution(engine: EmbeddedEngine, hf_model: Any) -> None:
    import torch

    prompt = [72, 101, 108, 108, 111]
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt])).logits[0, -1].float()
    n = 3000
    for temperature, top_p in ((1.0, 1.0), (0.5, 1.0), (1.0, 0.5)):
        probs = torch.softmax(logits / temperature, dim=-1)
        if top_p < 1.0:  # the nucleus: smallest set of top tokens whose mass reaches top_p
            sorted_p, order = probs.sort(descending=True)
            keep = (sorted_p.cumsum(0) - sorted_p) <= top_p
            probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
            probs /= probs.sum()
        params = SamplingParams(max_new_tokens=1, temperature=temperature, top_p=top_p)
        outs = _run(engine, [GenerateRequest(input_ids=prompt, sampling_params=params)] * n)
        counts = torch.bincount(
            torch.tensor([o.output_ids[0] for o in outs]), minlength=probs.numel()
        ).double()
        assert counts[probs == 0].sum() == 0  # nothing outside the nucleus is ever drawn
        # Pearson's chi-square over bins expecting >= 5 draws (the rest pooled): far below 5 sigma of chance
        expected = probs.double() * n
        big = expected >= 5
        observed = torch.cat([counts[big], counts[~big].sum()[None]])
        wanted = torch.cat([expected[big], expected[~big].sum()[None]])
        keep = wanted > 0
        chi2 = float(((observed[keep] - wanted[keep]) ** 2 / wanted[keep]).sum())
        dof = int(keep.sum()) - 1
        assert chi2 < dof + 5 * (2 * dof) ** 0.5, (temperature, top_p, chi2, dof)


def test_chunked_prefill_of_a_long_prompt_matches_hugging_face(tiny_model: Path, hf_model: Any) -> None:
    prompt = _prompts(1, seed=9)[0] * 6  # longer than several prefill chunks
    eng = EmbeddedEngine(
        EngineConfig(model_path=str(tiny_model), max_prefill_tokens=16, kv_cache_mem_gib=0.05)
    )
    try:
        alone = _run(eng, [GenerateRequest(input_ids=prompt, sampling_params=GREEDY)])[0]
        with_others = _run(
            eng, [GenerateRequest(input_ids=p, sampling_params=GREEDY) for p in [prompt[::-1], prompt]]
        )
    finally:
        eng.close()
    assert len(prompt) > 3 * 16
    assert alone.output_ids == hf_greedy(hf_model, prompt, 24) == with_others[1].output_ids


def test_the_trainer_takes_policy_logprobs_at_the_temperature_the_engine_sampled_at(
    engine: EmbeddedEngine, hf_model: Any
) -> None:
    """On-policy tokens sampled at temperature 0.7 have ratio 1 under `compute_gradients` only when the trainer
    divides the logits by the same temperature (``trainer.loss.temperature``; `gyre train` sets the run's)."""
    from gyre.config import LossConfig
    from gyre.protocol import MicroStep
    from gyre.train.objective import compute_gradients

    prompt = _prompts(1, seed=5)[0]
    params = SamplingParams(max_new_tokens=16, temperature=0.7, ignore_eos=True, sampling_seed=1)
    (out,) = _run(engine, [GenerateRequest(input_ids=prompt, sampling_params=params, return_logprob=True)])
    ids, n = prompt + out.output_ids, len(prompt)
    context = [0.0] * n
    micro = MicroStep(input_ids=ids, position_ids=list(range(len(ids))), parents=list(range(-1, len(ids) - 1)),
                      weights=context + [1.0 / 16] * 16, advantages=context + [1.0] * 16,
                      behaviour_logprobs=context + list(out.output_logprobs), versions=[-1] * n + [0] * 16,
                      sequences=1)  # fmt: skip
    try:
        tempered = compute_gradients(hf_model, micro, LossConfig(temperature=0.7, kl_coef=0.1), policy_version=0,
                                     reference=hf_model)  # fmt: skip
        plain = compute_gradients(hf_model, micro, LossConfig(), policy_version=0)
    finally:
        hf_model.zero_grad(set_to_none=True)
    assert abs(tempered.ratio_min - 1) < 1e-3 and abs(tempered.ratio_max - 1) < 1e-3
    assert abs(tempered.kl_sum) < 1e-6  # the reference, the same weights, is taken at the same temperature
    assert max(abs(plain.ratio_min - 1), abs(plain.ratio_max - 1)) > 0.05  # the mismatch it fixes

"""Decode lanes change where decode attention reads KV from, never what the engine computes."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from gyre.config import EngineConfig
from gyre.engine.embedded.asyncengine import EmbeddedEngine
from gyre.engine.embedded.scheduler import Request
from gyre.protocol import GenerateRequest, GenerateResponse, SamplingParams

NEW = 24
GREEDY = SamplingParams(max_new_tokens=NEW, temperature=0.0, ignore_eos=True)


def _prompts() -> list[list[int]]:
    """Mixed lengths, a few long enough to outgrow a 128-token lane while decoding."""
    rng = random.Random(5)
    lengths = [3, 9, 40, 17, 60, 5, 118, 31, 2, 124, 50, 12, 8, 110]
    return [[rng.randrange(256) for _ in range(n)] for n in lengths]


def _generate(engine: EmbeddedEngine, prompts: list[list[int]]) -> list[GenerateResponse]:
    reqs = [GenerateRequest(input_ids=p, sampling_params=GREEDY, return_logprob=True) for p in prompts]

    async def go() -> list[GenerateResponse]:
        return list(await asyncio.gather(*(engine.generate(r) for r in reqs)))

    return asyncio.run(go())


def _engine(model: Path, lanes: bool, mem_gib: float) -> EmbeddedEngine:
    return EmbeddedEngine(EngineConfig(model_path=str(model), decode_lanes=lanes, kv_cache_mem_gib=mem_gib))


def test_batched_decode_equals_one_at_a_time_with_lanes_on_and_off(tiny_model: Path) -> None:
    prompts = _prompts()
    solo_engine = _engine(tiny_model, lanes=False, mem_gib=0.25)
    try:
        solo = [_generate(solo_engine, [p])[0] for p in prompts]
        assert solo_engine.scheduler.stats.lane_decodes == 0
    finally:
        solo_engine.close()
    # 0.05 GiB: 8 lanes of 128 tokens, so some requests decode through the gather path in the same batch as lanes,
    # and the long prompts lose their lane when they outgrow it
    for lanes, mem_gib in ((True, 0.25), (False, 0.25), (True, 0.05)):
        engine = _engine(tiny_model, lanes=lanes, mem_gib=mem_gib)
        try:
            batched = _generate(engine, prompts)
            stats, sched = engine.scheduler.stats, engine.scheduler
            assert sched.lanes.positions <= sched.lane_positions
            assert not sched.lanes.count  # every finished request gave its lane back
        finally:
            engine.close()
        for one, many in zip(solo, batched, strict=True):
            assert many.output_ids == one.output_ids, (lanes, mem_gib)
            assert len(many.output_logprobs) == NEW
            diff = max(abs(a - b) for a, b in zip(many.output_logprobs, one.output_logprobs, strict=True))
            assert diff < 1e-4, (lanes, mem_gib, diff)
        if not lanes:
            assert stats.lane_decodes == 0 and stats.gathered_decodes > 0
        elif mem_gib == 0.25:
            assert stats.lane_decodes > 0 and stats.gathered_decodes == 0
        else:
            assert stats.lane_decodes > 0 and stats.gathered_decodes > 0


def test_lanes_come_out_of_the_kv_budget(tiny_model: Path) -> None:
    on, off = _engine(tiny_model, lanes=True, mem_gib=0.05), _engine(tiny_model, lanes=False, mem_gib=0.05)
    try:
        spec = on.spec
        slot_bytes = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * on.dtype.itemsize
        assert on.scheduler.kv_slots + on.scheduler.kv_slots // 7 <= off.scheduler.kv_slots
        # the pool plus the lanes, even while growing (old and new storage at once), fit in kv_cache_mem_gib
        peak = on.scheduler.kv_slots + on.scheduler.lane_positions * 3 // 2
        assert peak * slot_bytes <= 0.05 * 2**30
        _generate(on, _prompts())
        assert on.scheduler.lanes.positions <= on.scheduler.lane_positions
    finally:
        on.close()
        off.close()


def test_lanes_out_of_order_are_read_by_index_with_the_same_results(tiny_model: Path) -> None:
    """A lane whose owner sits out a step leaves a hole: the others' lanes are selected by index, not viewed."""
    prompts = _prompts()[:3]
    reference = _engine(tiny_model, lanes=False, mem_gib=0.05)
    engine = _engine(tiny_model, lanes=True, mem_gib=0.05)
    engine.close()  # drive its scheduler by hand
    try:
        solo = [_generate(reference, [p])[0] for p in prompts]
    finally:
        reference.close()
    sched = engine.scheduler
    reqs = [
        Request(rid=str(i), ids=list(p), n_input=len(p), params=GREEDY, return_logprob=True)
        for i, p in enumerate(prompts)
    ]
    for req in reqs:
        sched.add(req)
    while any(sched.lanes.lane(r) < 0 for r in reqs):
        sched.step()
    middle = reqs[1]
    assert sched.lanes.lane(middle) == 1
    sched.running.remove(middle)  # sits out two steps, keeping lane 1
    before = sched.stats.lane_decodes
    sched.step()
    sched.step()
    assert sched.stats.lane_decodes - before == 4 and sched.lanes.lane(middle) == 1
    sched.running.append(middle)
    while sched.running:
        sched.step()
    for req, one in zip(reqs, solo, strict=True):
        assert req.output_ids == one.output_ids
        assert max(abs(a - b) for a, b in zip(req.logprobs, one.output_logprobs, strict=True)) < 1e-4

"""Grammar-constrained decoding in the embedded engine: JSON schemas, regexes and EBNF (xgrammar) on a random model.

A random-weight model samples nearly uniformly, so whatever it writes under a grammar is the grammar's doing: every
output must parse and match, and the recorded logprobs must be those of the masked distribution it was drawn from.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from gyre.engine.embedded.asyncengine import EmbeddedEngine
from gyre.engine.launcher import ServerProcess
from gyre.errors import EngineRequestError
from gyre.protocol import GenerateRequest, GenerateResponse, SamplingParams

PROMPT = [10, 20, 30, 40, 50, 60]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer"},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "home": {
            "type": "object",
            "properties": {"x": {"type": "number"}, "indoor": {"type": "boolean"}},
            "required": ["x", "indoor"],
        },
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "kind", "home"],
}
ARGS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 6}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}


def _run(engine: EmbeddedEngine, reqs: list[GenerateRequest]) -> list[GenerateResponse]:
    async def go() -> list[GenerateResponse]:
        return list(await asyncio.gather(*(engine.generate(r) for r in reqs)))

    return asyncio.run(go())


def _req(
    seed: int, max_new_tokens: int = 600, temperature: float = 1.0, **constraint: str
) -> GenerateRequest:
    params = SamplingParams(
        max_new_tokens=max_new_tokens, temperature=temperature, sampling_seed=seed, **constraint
    )
    return GenerateRequest(input_ids=PROMPT, sampling_params=params, return_logprob=True)


def _check(value: Any, schema: dict[str, Any], where: str = "$") -> None:
    """Assert ``value`` satisfies ``schema`` (the subset these tests use; unlisted properties are refused, as
    xgrammar's strict mode does)."""
    if "enum" in schema:
        assert value in schema["enum"], where
        return
    kind = schema["type"]
    types = {"object": dict, "array": list, "string": str, "boolean": bool, "number": (int, float)}
    if kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), where
        return
    assert isinstance(value, types[kind]) and (kind == "boolean" or not isinstance(value, bool)), where
    if kind == "string":
        assert len(value) <= schema.get("maxLength", len(value)), where
    elif kind == "array":
        assert len(value) <= schema.get("maxItems", len(value)), where
        for i, item in enumerate(value):
            _check(item, schema["items"], f"{where}[{i}]")
    elif kind == "object":
        props = schema.get("properties", {})
        assert set(schema.get("required", ())) <= set(value), where
        if props:
            assert set(value) <= set(props), where
        for key, item in value.items():
            if key in props:
                _check(item, props[key], f"{where}.{key}")


def test_json_schema_output_parses_and_validates_at_temperature_one(engine: EmbeddedEngine) -> None:
    outs = _run(engine, [_req(seed, json_schema=json.dumps(PERSON)) for seed in range(6)])
    for out in outs:
        assert out.finish_type == "stop", out.text  # the grammar allows end-of-sequence only once complete
        _check(json.loads(out.text), PERSON)
        assert all(lp <= 0.0 and lp > float("-inf") for lp in out.output_logprobs)
    assert len({out.text for out in outs}) == 6  # sampled, not forced: the model's choices differ by seed


def test_json_object_gives_a_json_object(engine: EmbeddedEngine) -> None:
    outs = _run(engine, [_req(seed, 2000, json_schema='{"type": "object"}') for seed in range(4)])
    special = {i for i, tok in engine.tokenizer.added_tokens_decoder.items() if tok.special}
    for out in outs:
        assert out.finish_type == "stop"
        assert isinstance(json.loads(out.text), dict)
        assert not special & set(out.output_ids[:-1])  # <|im_start|> etc. never stand for text in a string


def test_regex_output_matches(engine: EmbeddedEngine) -> None:
    pattern = r"(yes|no), [0-9]{2,4} (cats?|dogs?)"
    for out in _run(engine, [_req(seed, regex=pattern) for seed in range(6)]):
        assert out.finish_type == "stop"
        assert re.fullmatch(pattern, out.text), out.text


def test_tool_call_ebnf_from_xgrammar_parses(engine: EmbeddedEngine) -> None:
    import xgrammar

    call = {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": ARGS},
            "required": ["name", "arguments"]}  # fmt: skip
    grammar = xgrammar.Grammar.concat(
        xgrammar.Grammar.from_ebnf('root ::= "<tool_call>\\n"'),
        xgrammar.Grammar.from_json_schema(json.dumps(call), any_whitespace=False),
        xgrammar.Grammar.from_ebnf('root ::= "\\n</tool_call>"'),
    )
    for out in _run(engine, [_req(seed, ebnf=str(grammar)) for seed in range(4)]):
        assert out.finish_type == "stop"
        match = re.fullmatch(r"<tool_call>\n(.*)\n</tool_call>", out.text, re.DOTALL)
        assert match, out.text
        parsed = json.loads(match.group(1))
        assert parsed["name"] == "get_weather"
        _check(parsed["arguments"], ARGS)


def test_logprobs_are_those_of_the_masked_distribution(engine: EmbeddedEngine, hf_model: Any) -> None:
    schema = json.dumps(PERSON)
    for temperature in (1.0, 0.7, 0.0):
        out = _run(engine, [_req(5, temperature=temperature, json_schema=schema)])[0]
        matcher = engine.grammars.matcher("json_schema", schema) if engine.grammars else None
        assert matcher is not None
        import xgrammar

        with torch.no_grad():
            logits = hf_model(torch.tensor([PROMPT + out.output_ids])).logits[0, len(PROMPT) - 1 :].float()
        bitmask = xgrammar.allocate_token_bitmask(1, logits.shape[1])
        ref = []
        for i, token in enumerate(out.output_ids):
            matcher.fill_next_token_bitmask(bitmask)
            row = logits[i : i + 1].clone()
            xgrammar.apply_token_bitmask_inplace(row, bitmask)
            ref.append(float(torch.log_softmax(row / (temperature or 1.0), dim=-1)[0, token]))
            if temperature == 0.0:
                assert token == int(row.argmax())  # greedy picks the best allowed token
            assert matcher.accept_token(token)
        assert max(abs(a - b) for a, b in zip(out.output_logprobs, ref, strict=True)) < 1e-4
        unmasked = torch.log_softmax(logits[: len(out.output_ids)] / (temperature or 1.0), dim=-1)
        raw = unmasked.gather(1, torch.tensor(out.output_ids)[:, None]).squeeze(1).tolist()
        assert all(m >= r - 1e-6 for m, r in zip(out.output_logprobs, raw, strict=True))
        assert sum(out.output_logprobs) > sum(raw) + 1.0  # the mask moved real mass


def test_a_forced_token_has_logprob_zero(engine: EmbeddedEngine) -> None:
    out = _run(engine, [_req(1, regex="abc")])[0]
    assert out.text == "abc" and out.finish_type == "stop"
    assert out.output_logprobs[:3] == [0.0, 0.0, 0.0]  # one byte allowed at each step
    eos_choice = out.output_logprobs[3]  # then only the end: two end-of-sequence ids
    assert -1.5 < eos_choice < 0.0


def test_min_new_tokens_and_ignore_eos_yield_to_a_complete_match(engine: EmbeddedEngine) -> None:
    params = SamplingParams(max_new_tokens=20, min_new_tokens=10, ignore_eos=True, regex="abc")
    out = _run(engine, [GenerateRequest(input_ids=PROMPT, sampling_params=params)])[0]
    assert out.text == "abc" and out.finish_type == "stop"  # the grammar allows nothing but the end
    free = SamplingParams(max_new_tokens=12, min_new_tokens=10, temperature=1.0, sampling_seed=0)
    outs = _run(engine, [GenerateRequest(input_ids=PROMPT, sampling_params=free)] * 4)
    assert all(
        len(o.output_ids) >= 10 for o in outs
    )  # banning the end before min_new_tokens edits the logits


def test_batch_mixes_constrained_and_free_requests(engine: EmbeddedEngine) -> None:
    free = SamplingParams(max_new_tokens=40, temperature=1.0, ignore_eos=True, sampling_seed=0)
    reqs = [_req(s, regex="[0-9]{30}") for s in range(3)]
    reqs += [GenerateRequest(input_ids=PROMPT, sampling_params=free, rid=f"free-{i}") for i in range(3)]
    outs = _run(engine, reqs)
    for out in outs[:3]:
        assert re.fullmatch("[0-9]{30}", out.text) and out.finish_type == "stop"
    for out in outs[3:]:  # the mask touched only its own rows
        assert out.finish_type == "length" and len(out.output_ids) == 40
        assert sum(not (48 <= t <= 57) for t in out.output_ids) > 20


def test_streaming_under_a_schema(engine: EmbeddedEngine) -> None:
    body = _req(2, json_schema=json.dumps(PERSON))
    body.stream = True

    async def go() -> list[GenerateResponse]:
        return [chunk async for chunk in engine.generate_stream(body)]

    chunks = asyncio.run(go())
    assert len(chunks) > 10 and chunks[-1].finish_type == "stop"
    assert all(c.finish_type is None for c in chunks[:-1])
    _check(json.loads(chunks[-1].text), PERSON)
    whole = _run(engine, [_req(2, json_schema=json.dumps(PERSON))])[0]
    assert whole.output_ids == chunks[-1].output_ids  # same seed, same grammar: same sample


def test_max_new_tokens_cuts_an_incomplete_output(engine: EmbeddedEngine) -> None:
    out = _run(engine, [_req(0, max_new_tokens=10, regex="[a-z]{50}")])[0]
    assert out.finish_type == "length" and len(out.output_ids) == 10
    assert re.fullmatch("[a-z]{10}", out.text)


def test_retracted_request_resumes_with_its_grammar_state(engine: EmbeddedEngine) -> None:
    pattern = "[a-z]{400}"
    body = _req(0, regex=pattern)
    body.stream = True

    async def go() -> tuple[GenerateResponse, int]:
        retracted = -1
        async for chunk in engine.generate_stream(body):
            if retracted < 0 and len(chunk.output_ids) >= 20:
                before = engine.scheduler.stats.retracted
                await engine.pause(
                    "retract"
                )  # re-prefilled on continue: the matcher has seen exactly its output
                retracted = engine.scheduler.stats.retracted - before
                await engine.continue_generation()
        return chunk, retracted

    out, retracted = asyncio.run(go())
    assert retracted == 1
    assert out.finish_type == "stop" and re.fullmatch(pattern, out.text)


def test_a_token_the_grammar_refuses_ends_that_request_only(
    engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert engine.grammars is not None
    shared = engine.grammars.matcher(
        "regex", "ab"
    )  # two requests on one matcher: the second's "a" is refused
    monkeypatch.setattr(engine.grammars, "matcher", lambda kind, text: shared)

    async def go() -> list[GenerateResponse]:
        await engine.pause("in_place")  # both requests join the same step
        tasks = [asyncio.create_task(engine.generate(_req(s, regex="ab"))) for s in range(2)]
        async with asyncio.timeout(30):
            while True:
                if engine.statistics().waiting_requests == 2:
                    break
                await asyncio.sleep(0.01)
        await engine.continue_generation()
        return list(await asyncio.gather(*tasks))

    first, second = asyncio.run(go())
    assert first.text == "ab" and first.finish_type == "stop"
    assert second.finish_type == "abort" and second.text == "a"
    assert "grammar refused sampled token" in second.meta_info.finish_reason["message"]
    monkeypatch.undo()
    assert _run(engine, [_req(0, regex="[0-9]")])[0].finish_type == "stop"  # the engine serves on


def test_bad_constraints_are_refused_with_the_reason(engine: EmbeddedEngine) -> None:
    cases = [
        ({"json_schema": '{"type": 5}'}, "json_schema is invalid: Type should be a string"),
        ({"json_schema": "{not json"}, "json_schema is invalid"),
        ({"regex": "a(b"}, "regex is invalid: Regex parsing error at position 4"),
        (
            {"ebnf": "root ::= missing"},
            'ebnf is invalid: EBNF parser error at line 1, column 10: Rule "missing"',
        ),
        ({"regex": "a", "json_schema": "{}"}, "at most one of json_schema, regex and ebnf"),
    ]
    for constraint, reason in cases:
        with pytest.raises(EngineRequestError, match=re.escape(reason)) as info:
            _run(engine, [_req(0, **constraint)])
        assert "/project/" not in str(info.value)  # xgrammar's log prefix is stripped
    assert engine.statistics().running_requests == 0


def test_bad_constraints_are_http_400_with_the_reason(server: ServerProcess) -> None:
    def post(params: dict[str, Any]) -> httpx.Response:
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, **params}}
        return httpx.post(f"{server.url}/generate", json=body, timeout=60)

    bad = post({"json_schema": '{"type": "object", "properties": {"a": {"type": "nope"}}}'})
    assert bad.status_code == 400
    assert bad.json()["error"]["message"].startswith("sampling_params.json_schema is invalid: ")
    both = post({"regex": "a", "ebnf": 'root ::= "a"'})
    assert both.status_code == 400 and "at most one of" in both.json()["error"]["message"]
    good = post({"regex": "[0-9]{3}"})
    assert good.status_code == 200 and re.fullmatch("[0-9]{3}", good.json()["text"])


def test_xgrammar_is_imported_only_for_a_constrained_request(tiny_model: Path) -> None:
    code = f"""
import asyncio, sys
from gyre.config import EngineConfig
from gyre.engine.embedded.asyncengine import EmbeddedEngine
from gyre.protocol import GenerateRequest, SamplingParams
eng = EmbeddedEngine(EngineConfig(model_path={str(tiny_model)!r}, kv_cache_mem_gib=0.05))
params = SamplingParams(max_new_tokens=4)
asyncio.run(eng.generate(GenerateRequest(input_ids=[1, 2, 3], sampling_params=params)))
print("xgrammar" in sys.modules)
asyncio.run(eng.generate(GenerateRequest(input_ids=[1, 2, 3], sampling_params=SamplingParams(regex="[0-9]"))))
print("xgrammar" in sys.modules)
eng.close()
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["False", "True"]

"""TITO with shared id buffers (`IdSpan`): a chain, calls in flight together from one call, and the chains that go
on from each of them all send the engine exactly their parent's ids + output + their own new ids."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fakes import ScriptedEngine
from gyre.config import RouterConfig
from gyre.engine.models import load_tokenizer
from gyre.journal.records import CallRecord, expand_inputs
from gyre.router.openai_types import ChatRequest
from gyre.router.routing import Router


def test_concurrent_calls_from_one_call_and_their_chains_extend_exactly_their_parent(
    tiny_model: Path,
) -> None:
    tokenizer = load_tokenizer(tiny_model)
    with ScriptedEngine(tokenizer, lambda ids: f"reply after {len(ids)} tokens") as fake:

        async def go() -> tuple[list[dict[str, Any]], list[CallRecord]]:
            router = Router(RouterConfig(model_path=str(tiny_model), engines=[fake.url]))
            token = router.open_session("branches")

            async def chat(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
                body = await router.chat(token, ChatRequest(model="tiny", messages=messages))
                return [*messages, {"role": "assistant", "content": body["choices"][0]["message"]["content"]}]

            a = await chat([{"role": "user", "content": "task"}])
            b = await chat([*a, {"role": "user", "content": "go on"}])  # the chain: appended in place
            # an older call that was extended is no longer matched: this one renders whole, a new branch
            await chat([*a, {"role": "user", "content": "try another way"}])
            # two calls from b at once: the second starts while the first is in flight on b's buffer
            x, y = await asyncio.gather(
                chat([*b, {"role": "user", "content": "left"}]),
                chat([*b, {"role": "user", "content": "right"}]),
            )
            await chat([*x, {"role": "user", "content": "more left"}])
            await chat([*y, {"role": "user", "content": "more right"}])
            records = router.records(token)
            await router.aclose()
            return list(fake.requests), records

        requests, records = asyncio.run(go())
    by_id = {r.call_id: r for r in records}
    a, b, _, first, second, xx, yy = records
    # both calls from b had b as parent: the second started before the first was finished (b still a leaf)
    assert [r.parent_call_id for r in records[:5]] == [None, a.call_id, None, b.call_id, b.call_id]
    assert {xx.parent_call_id, yy.parent_call_id} == {first.call_id, second.call_id}
    full = expand_inputs(records)
    for r in records:  # each input is its parent's input + output + its own new ids, nothing from elsewhere
        if r.parent_call_id is not None:
            parent = by_id[r.parent_call_id]
            assert full[r.call_id] == full[parent.call_id] + parent.output_ids + r.new_input_ids
    # what the engine saw is what was recorded, for every call, the two in flight together included
    assert sorted(req["input_ids"] for req in requests) == sorted(full[r.call_id] for r in records)
    left, right = tokenizer.decode(full[xx.call_id]), tokenizer.decode(full[yy.call_id])
    assert "more left" in left and "right" not in left
    assert "more right" in right and "left" not in right
    assert "try another way" not in left + right

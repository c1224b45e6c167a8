"""Admission of calls (`CallGate`) and the value count that refuses a body before it is decoded (issue 48)."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.router.app import count_values
from gyre.router.openai_types import RouterError
from gyre.router.sessions import CallGate, Session, SessionStore


class Calls:
    """Calls held open at the gate until released, each noting when it was admitted."""

    def __init__(self, gate: CallGate) -> None:
        self.gate = gate
        self.admitted: list[str] = []
        self.done: dict[str, asyncio.Event] = {}

    async def call(self, session: Session, name: str) -> None:
        self.done[name] = asyncio.Event()
        async with self.gate.admit(session):
            self.admitted.append(name)
            await self.done[name].wait()


async def _settle() -> None:
    """Let every task that can run now run (the gate hands slots over within one loop turn)."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_flooding_session_waits_behind_its_own_limit_while_another_session_is_admitted() -> None:
    async def main() -> None:
        store = SessionStore()
        flood, polite = store.open("flood"), store.open("polite")
        gate = CallGate(per_session=2)
        calls = Calls(gate)
        async with asyncio.TaskGroup() as group:
            for i in range(10):
                group.create_task(calls.call(flood, f"f{i}"))
            await _settle()
            assert calls.admitted == ["f0", "f1"]
            assert (flood.running, len(flood.waiting), flood.waited) == (2, 8, 8)
            group.create_task(calls.call(polite, "p0"))  # arrives after eight waiting flood calls
            await _settle()
            assert calls.admitted == ["f0", "f1", "p0"]  # admitted at once, ahead of all eight
            assert gate.statistics(polite).waited == 0
            calls.done["f0"].set()
            await _settle()
            assert calls.admitted[-1] == "f2"  # the flood's next call, in its order
            for name in [f"f{i}" for i in range(1, 10)] + ["p0"]:
                calls.done[name].set()
                await _settle()
        stats = gate.statistics(flood)
        assert (stats.peak_running, stats.running, stats.waiting, stats.waited) == (2, 0, 0, 8)
        assert calls.admitted == ["f0", "f1", "p0"] + [f"f{i}" for i in range(2, 10)]
        assert gate.running == 0

    asyncio.run(main())


def test_at_the_routers_cap_a_freed_slot_goes_to_the_session_with_the_fewest_calls_running() -> None:
    async def main() -> None:
        store = SessionStore()
        flood, a, b = store.open("flood"), store.open("a"), store.open("b")
        gate = CallGate(per_session=4, total=4)
        calls = Calls(gate)
        async with asyncio.TaskGroup() as group:
            for i in range(8):
                group.create_task(calls.call(flood, f"f{i}"))
            await _settle()
            group.create_task(calls.call(a, "a0"))
            group.create_task(calls.call(b, "b0"))
            await _settle()
            assert calls.admitted == ["f0", "f1", "f2", "f3"]  # the cap: all four slots the flood's
            calls.done["f0"].set()
            await _settle()
            assert calls.admitted[-1] == "a0"  # not f4, which waited longer: a holds no slot
            calls.done["f1"].set()
            await _settle()
            assert calls.admitted[-1] == "b0"
            for name in ["f2", "f3", "a0", "b0"] + [f"f{i}" for i in range(4, 8)]:
                calls.done[name].set()
                await _settle()
        assert gate.running == 0

    asyncio.run(main())


def test_a_waiting_call_whose_client_went_away_gives_its_place_up() -> None:
    async def main() -> None:
        store = SessionStore()
        flood = store.open("flood")
        gate = CallGate(per_session=1)
        calls = Calls(gate)
        async with asyncio.TaskGroup() as group:
            group.create_task(calls.call(flood, "f0"))
            gone = group.create_task(calls.call(flood, "f1"))
            group.create_task(calls.call(flood, "f2"))
            await _settle()
            gone.cancel()
            await _settle()
            assert len(flood.waiting) == 1
            calls.done["f0"].set()
            await _settle()
            assert calls.admitted == ["f0", "f2"]
            calls.done["f2"].set()
        assert (flood.running, gate.running) == (0, 0)

    asyncio.run(main())


def test_too_many_values_are_refused_before_decoding_naming_the_limit() -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": ""}] * 50_000}).encode()
    with pytest.raises(RouterError, match=r"at most 200000 are accepted \(router.max_json_values\)") as err:
        count_values(body, 200_000)
    assert err.value.status == 400
    # commas and brackets inside strings are text: a long conversation about code is not refused
    code = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "f(a, [b], {c: d}), " * 100_000}]}
    )
    assert count_values(code.encode(), 200_000) < 20


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda kids: st.lists(kids) | st.dictionaries(st.text(), kids),
    )
)
def test_the_count_never_undercounts_the_values_decoded(value: object) -> None:
    """Each key, and each value but a container's first, follows a ',' or ':'; a first one, its opening bracket."""

    def values(v: object) -> int:
        if isinstance(v, list):
            return 1 + sum(values(x) for x in v)
        if isinstance(v, dict):
            return 1 + sum(1 + values(x) for x in v.values())
        return 1

    raw = msgspec.json.encode(value)
    quick = count_values(raw, 1 << 30)  # strings counted as they are
    try:
        exact = count_values(raw, quick - 1)  # over the limit: strings cut out, counted again
    except RouterError:
        exact = quick  # nothing in the strings looked like structure
    assert quick >= exact >= values(value)

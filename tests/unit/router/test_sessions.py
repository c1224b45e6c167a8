"""A session's TITO state: shared id buffers (`IdSpan`) and the exact match of a request to the call it extends."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from gyre.router.sessions import IdSpan, Session, Turn


def test_a_chain_shares_one_buffer_and_a_branch_does_not_see_later_appends() -> None:
    root = IdSpan.of([1, 2, 3])
    a = root.extend([4, 5])  # the newest call of the chain: appended in place
    assert a.buffer is root.buffer and a.ids() == [1, 2, 3, 4, 5] and root.copy() == [1, 2, 3]
    b = a.extend([6])
    branch = a.extend([7, 8])  # a second call from ``a``: ``b`` already appended after it, so a copy
    assert branch.buffer is not a.buffer and branch.ids() == [1, 2, 3, 4, 5, 7, 8]
    c = b.extend([9])  # the chain goes on in place; the branch keeps its ids
    assert c.buffer is a.buffer and c.ids() == [1, 2, 3, 4, 5, 6, 9]
    assert (
        branch.ids() == [1, 2, 3, 4, 5, 7, 8]
        and a.copy() == [1, 2, 3, 4, 5]
        and b.copy() == [1, 2, 3, 4, 5, 6]
    )


def test_an_in_flight_input_is_never_grown_by_another_call() -> None:
    turn = IdSpan.of([1, 2])
    same = turn.extend(
        []
    )  # nothing new: still a buffer of its own, so the turn's next extension cannot reach it
    engine_sees = same.ids()
    turn.extend([3])
    assert engine_sees == [1, 2]
    first = turn.extend([4])
    engine_sees = first.ids()  # held by the engine while the call runs: the buffer itself, no copy
    assert engine_sees is first.buffer
    turn.extend([5])  # a sibling from the same turn, in flight at the same time
    assert engine_sees == [1, 2, 4]


@given(st.lists(st.tuples(st.integers(0, 50), st.lists(st.integers(0, 9), max_size=4)), max_size=60))
def test_spans_equal_plain_lists_under_any_extensions(steps: list[tuple[int, list[int]]]) -> None:
    spans, plain = [IdSpan.of([0])], [[0]]
    for pick, ids in steps:
        at = pick % len(spans)
        spans.append(spans[at].extend(ids))
        plain.append(plain[at] + ids)
        assert [s.copy() for s in spans] == plain  # no extension ever changes another span's ids


def _turn(messages: list[dict[str, Any]]) -> Turn:
    return Turn("c0", messages, None, {"role": "assistant", "content": "ok"}, IdSpan.of([1, 2]), True)


def test_the_extended_call_is_matched_exactly_on_every_message() -> None:
    history = [{"role": "system", "content": "s" * 100}] + [
        {"role": "user" if k % 2 else "assistant", "content": f"m{k:04d}"} for k in range(1, 200)
    ]
    session = Session(token="t", execution_id="e")
    turn = _turn(history)
    session.remember(turn, None)
    follow = [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]
    # as a scaffold sends it over HTTP: every message a fresh object
    fresh = msgspec.json.decode(msgspec.json.encode(history + follow))
    assert session.find_extended(fresh, None) is turn
    # one character changed in the first message: same lengths, same last message; no match, so a fresh render
    edited = msgspec.json.decode(msgspec.json.encode(history + follow))
    edited[0]["content"] = "s" * 99 + "t"
    assert session.find_extended(edited, None) is None
    other_tools = [{"type": "function", "function": {"name": "x"}}]
    assert session.find_extended(fresh, other_tools) is None
    # a longer leaf that differs in its last message is passed over; one that matches wins
    session.remember(_turn(fresh[:200] + [{"role": "assistant", "content": "ok!"}]), None)
    assert session.find_extended(fresh, None) is turn
    longest = _turn(fresh[:201])
    session.remember(longest, None)
    assert session.find_extended(fresh, None) is longest
    # a leaf that is extended stops being one
    child = _turn(fresh)
    session.remember(child, longest)
    assert session.find_extended(fresh + follow, None) is child
    assert session.find_extended(fresh, None) is turn  # ``longest`` was extended: not a leaf any more

"""`input_tails` gives `expand_inputs` cut to its last ids, linearly, on branching sessions."""

from __future__ import annotations

import pytest

from gyre.journal.records import CallRecord, CallTiming, expand_inputs, input_tails

_TIMING = CallTiming(submitted_s=0.0, first_token_s=None, finished_s=0.0)


def _record(
    call_id: str, parent: CallRecord | None, full_prefix: int, new: list[int], out: list[int]
) -> CallRecord:
    return CallRecord(
        call_id=call_id, session="s", role="main", parent_call_id=parent.call_id if parent else None,
        prefix_len=full_prefix, new_input_ids=new, output_ids=out, output_logprobs=[-1.0] * len(out),
        finish_reason="stop", weight_version=0, cell="c", timing=_TIMING,
    )  # fmt: skip


def _session() -> list[CallRecord]:
    a = _record("a", None, 0, [1, 2, 3], [4, 5])
    b = _record("b", a, 5, [6], [7, 8, 9])
    c = _record("c", b, 9, [10, 11], [])
    d = _record("d", a, 5, [12, 13, 14, 15], [16])  # a branch off a
    e = _record("e", None, 0, [17], [18])  # a new branch
    f = _record("f", c, 11, [], [19])  # nothing new in the input
    return [a, b, c, d, e, f]


@pytest.mark.parametrize("keep", [0, 1, 2, 4, 7, 100])
def test_input_tails_equal_expanded_inputs_cut(keep: int) -> None:
    records = _session()
    full = expand_inputs(records)
    tails = input_tails(records, keep)
    for r in records:
        ids = full[r.call_id]
        assert tails[r.call_id] == (len(ids), ids[max(len(ids) - keep, 0) :])


def test_input_tails_refuse_what_expand_inputs_refuses() -> None:
    a, b = _session()[:2]
    with pytest.raises(ValueError, match="comes later"):
        input_tails([b, a], 4)
    wrong = _record("b", a, 4, [6], [])
    with pytest.raises(ValueError, match="prefix tokens"):
        input_tails([a, wrong], 4)

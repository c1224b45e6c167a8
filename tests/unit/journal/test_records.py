"""gyre.journal.records: a CallRecord survives its journal line token for token; output ids and logprobs stay paired."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.journal.records import (
    ApiCallRecord,
    CallRecord,
    CallTiming,
    decode_record,
    encode_record,
    expand_inputs,
)


def _record(**changes: object) -> CallRecord:
    fields: dict[str, object] = {
        "call_id": "run-1/c0",
        "session": "s0",
        "role": "main",
        "new_input_ids": [151644, 872, 198],
        "output_ids": [9707, 151645],
        "output_logprobs": [-0.125, -1e-9],
        "finish_reason": "stop",
        "weight_version": 3,
        "cell": "engine-0",
        "timing": CallTiming(submitted_s=1700000000.25, first_token_s=1700000000.5, finished_s=1700000001.0),
    }
    fields.update(changes)
    return CallRecord(**fields)  # type: ignore[arg-type]


def test_round_trip_keeps_every_field() -> None:
    record = _record(parent_call_id="run-1/cprev", prefix_len=7)
    line = encode_record(record)
    assert b"\n" not in line  # one journal line
    assert decode_record(line) == record
    assert decode_record(line.decode()) == record  # str lines decode too


def test_round_trip_with_nothing_generated() -> None:
    timing = CallTiming(submitted_s=1.0, first_token_s=None, finished_s=2.0)
    record = _record(output_ids=[], output_logprobs=[], finish_reason="abort", timing=timing)
    decoded = decode_record(encode_record(record))
    assert decoded == record
    assert decoded.timing.first_token_s is None
    assert decoded.parent_call_id is None


@given(
    input_ids=st.lists(st.integers(0, 2**31 - 1), max_size=50),
    pairs=st.lists(
        st.tuples(st.integers(0, 2**31 - 1), st.floats(max_value=0.0, allow_nan=False, allow_infinity=False)),
        max_size=50,
    ),
    role=st.sampled_from(["main", "main-summary", "sub-agent", "sub-agent-summary"]),
)
def test_round_trip_is_exact_for_any_tokens_and_logprobs(
    input_ids: list[int], pairs: list[tuple[int, float]], role: str
) -> None:
    record = _record(
        new_input_ids=input_ids,
        output_ids=[t for t, _ in pairs],
        output_logprobs=[lp for _, lp in pairs],
        role=role,
    )
    decoded = decode_record(encode_record(record))
    assert decoded.new_input_ids + decoded.output_ids == input_ids + [t for t, _ in pairs]
    # bit-exact floats: a behaviour logprob that drifts in the last ulp breaks importance ratios
    assert [x.hex() for x in decoded.output_logprobs] == [x.hex() for x in record.output_logprobs]
    assert decoded == record


def test_mismatched_lengths_raise_on_construction() -> None:
    with pytest.raises(ValueError, match=r"run-1/c0: 2 output ids but 1 logprobs"):
        _record(output_ids=[1, 2], output_logprobs=[-0.5])
    with pytest.raises(ValueError, match="0 output ids but 1 logprobs"):
        _record(output_ids=[], output_logprobs=[-0.5])


def test_mismatched_lengths_raise_on_decode() -> None:
    fields = msgspec.to_builtins(_record())
    fields["output_logprobs"] = fields["output_logprobs"][:1]
    line = msgspec.json.encode(fields)
    with pytest.raises(msgspec.ValidationError, match="2 output ids but 1 logprobs"):
        decode_record(line)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b'"role":"main"', b'"role":"critic"'),
        (b'"finish_reason":"stop"', b'"finish_reason":"done"'),
        (b'"weight_version":3', b'"weight_version":"3"'),
        (b'"output_versions":null', b'"output_versions":["3","3"]'),
    ],
)
def test_decode_rejects_invalid_fields(old: bytes, new: bytes) -> None:
    line = encode_record(_record())
    assert old in line
    with pytest.raises(msgspec.ValidationError):
        decode_record(line.replace(old, new))


def test_expand_inputs_rebuilds_full_inputs_from_deltas() -> None:
    first = _record(call_id="a", new_input_ids=[1, 2, 3], output_ids=[4, 5], output_logprobs=[-0.1, -0.2])
    second = _record(
        call_id="b",
        parent_call_id="a",
        prefix_len=5,
        new_input_ids=[6],
        output_ids=[7],
        output_logprobs=[-1.0],
    )
    branch = _record(call_id="c", new_input_ids=[9, 9], output_ids=[], output_logprobs=[])
    third = _record(
        call_id="d", parent_call_id="b", prefix_len=7, new_input_ids=[8], output_ids=[], output_logprobs=[]
    )
    full = expand_inputs([first, second, branch, third])
    assert full == {"a": [1, 2, 3], "b": [1, 2, 3, 4, 5, 6], "c": [9, 9], "d": [1, 2, 3, 4, 5, 6, 7, 8]}
    with pytest.raises(ValueError, match="prefix"):
        expand_inputs([first, _record(call_id="x", parent_call_id="a", prefix_len=4, new_input_ids=[1])])
    with pytest.raises(ValueError, match="comes later"):
        expand_inputs([second, first])
    with pytest.raises(ValueError, match="parent"):
        _record(parent_call_id="a")  # a parent without a prefix length


def test_record_is_frozen() -> None:
    record = _record()
    with pytest.raises(AttributeError):
        record.weight_version = 4  # type: ignore[misc]


@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
def test_non_finite_logprob_is_refused_at_construction(bad: float) -> None:
    # JSON cannot carry NaN or infinities back, so such a record would be written but never read again
    with pytest.raises(ValueError, match="NaN or infinite"):
        _record(output_ids=[1], output_logprobs=[bad])


# ---- weight versions per token, and who produced the output ---------------------------------------------------------
def test_a_moved_call_keeps_each_tokens_version_through_its_journal_line() -> None:
    record = _record(output_ids=[7, 8, 9], output_logprobs=[-0.1, -0.2, -0.3], output_versions=[3, 3, 4])
    decoded = decode_record(encode_record(record))
    assert decoded == record
    assert decoded.token_versions() == [3, 3, 4]
    assert decoded.weight_version == 3  # the first output token's


def test_without_per_token_versions_every_token_has_the_calls_version() -> None:
    record = _record(output_ids=[7, 8, 9], output_logprobs=[-0.1, -0.2, -0.3])
    assert record.output_versions is None
    assert record.token_versions() == [3, 3, 3]
    assert _record(output_ids=[], output_logprobs=[]).token_versions() == []


def test_per_token_versions_must_pair_with_output_ids() -> None:
    with pytest.raises(ValueError, match=r"run-1/c0: 2 output ids but 3 weight versions"):
        _record(output_versions=[3, 3, 4])
    with pytest.raises(ValueError, match="weight_version 3 is not the first output token's"):
        _record(output_versions=[4, 4])
    fields = msgspec.to_builtins(_record(output_versions=[3, 4]))
    fields["output_versions"] = [3]
    with pytest.raises(msgspec.ValidationError, match="2 output ids but 1 weight versions"):
        decode_record(msgspec.json.encode(fields))


def test_a_journal_line_written_before_versions_and_sources_still_decodes() -> None:
    old = (
        b'{"call_id":"run-1/c0","session":"s0","role":"main","parent_call_id":null,"prefix_len":0,'
        b'"new_input_ids":[151644,872,198],"output_ids":[9707,151645],"output_logprobs":[-0.125,-1e-9],'
        b'"finish_reason":"stop","weight_version":3,"cell":"engine-0",'
        b'"timing":{"submitted_s":1700000000.25,"first_token_s":1700000000.5,"finished_s":1700000001.0}}'
    )
    record = decode_record(old)
    assert record == _record()
    assert (record.source, record.output_versions, record.token_versions()) == ("policy", None, [3, 3])


def test_source_is_recorded_and_checked() -> None:
    line = encode_record(_record(source="scripted"))
    assert decode_record(line).source == "scripted"
    with pytest.raises(msgspec.ValidationError, match="source"):
        decode_record(line.replace(b'"source":"scripted"', b'"source":"human"'))


def test_upstream_calls_say_they_are_upstream() -> None:
    timing = CallTiming(submitted_s=1.0, first_token_s=1.5, finished_s=2.0)
    record = ApiCallRecord(call_id="u0", session="s0", role="main", endpoint="chat/completions", request={},
                           response={}, prompt_tokens=3, completion_tokens=2, timing=timing)  # fmt: skip
    assert record.source == "upstream"
    assert msgspec.json.decode(msgspec.json.encode(record), type=ApiCallRecord) == record

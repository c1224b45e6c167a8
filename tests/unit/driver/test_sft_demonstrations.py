"""Reading demonstrations: which calls count, what is left out and why; a bad journal is one clear error."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gyre.config import load_config
from gyre.driver.sft import batches, journal_file, load_demonstrations
from gyre.errors import ConfigError
from gyre.journal import Journal
from gyre.journal.records import ApiCallRecord, CallRecord, CallTiming, RecordSource

TIMING = CallTiming(submitted_s=0.0, first_token_s=None, finished_s=0.0)
ALL: list[str] = ["policy", "scripted", "upstream"]


def chain(
    name: str, turns: list[tuple[list[int], list[int]]], source: RecordSource = "scripted"
) -> list[CallRecord]:
    """A session whose calls each extend the one before: ``turns`` are (new input, output) pairs."""
    records: list[CallRecord] = []
    length = 0
    for i, (new_input, output) in enumerate(turns):
        parent = records[-1].call_id if records else None
        records.append(
            CallRecord(call_id=f"{name}-{i}", session=name, role="main", parent_call_id=parent,
                       prefix_len=length, new_input_ids=new_input, output_ids=output,
                       output_logprobs=[0.0] * len(output), finish_reason="stop", weight_version=0,
                       cell="scripted", timing=TIMING, source=source)
        )  # fmt: skip
        length += len(new_input) + len(output)
    return records


def journal(directory: Path, *sessions: list[CallRecord]) -> Path:
    j = Journal(directory)
    for records in sessions:
        for r in records:
            j.append(r)
    j.close()
    return j.path


def test_only_the_accepted_sources_count_and_a_call_extending_a_left_out_one_goes_with_it(
    tmp_path: Path,
) -> None:
    expert = chain("expert", [([1, 2, 3], [4, 5]), ([6], [7, 8]), ([9], [10])])
    policy = chain("policy", [([1, 2], [3]), ([4], [5])], source="policy")
    mixed = [*chain("mixed", [([1], [2])], source="policy"), *chain("mixed", [([1], [2]), ([3], [4])])[1:]]
    path = journal(tmp_path, expert, policy, mixed)

    demos = load_demonstrations([path], ["scripted"], 0)
    assert [[r.session for r in s] for s in demos.sessions] == [["expert"] * 3]
    assert demos.calls == 3 and demos.skipped == {"source policy": 3, "extends a call left out": 1}
    assert demos.journals == [str(path)]

    everything = load_demonstrations([path], ALL, 0)
    assert everything.calls == 7 and everything.skipped == {} and len(everything.sessions) == 3


def test_calls_longer_than_max_seq_len_are_left_out_with_the_calls_extending_them(tmp_path: Path) -> None:
    path = journal(
        tmp_path, chain("s", [([1] * 8, [2] * 2), ([3] * 8, [4] * 2), ([5] * 8, [6] * 2)])
    )  # 10, 20, 30
    demos = load_demonstrations([path], ["scripted"], 25)
    assert [r.call_id for r in demos.sessions[0]] == ["0/s-0", "0/s-1"]
    assert demos.skipped == {"longer than 25 tokens": 1}


def test_two_journals_keep_their_calls_apart_even_with_the_same_call_ids(tmp_path: Path) -> None:
    a = journal(tmp_path / "a", chain("s", [([1], [2]), ([3], [4])]))
    b = journal(tmp_path / "b", chain("s", [([1], [9]), ([3], [4])]))
    demos = load_demonstrations([a, b], ["scripted"], 0)
    assert len(demos.sessions) == 2
    assert [(r.call_id, r.parent_call_id) for r in demos.sessions[1]] == [("1/s-0", None), ("1/s-1", "1/s-0")]


def test_a_session_without_any_output_tokens_is_left_out(tmp_path: Path) -> None:
    path = journal(tmp_path, chain("mute", [([1, 2], [])]), chain("s", [([1], [2])]))
    demos = load_demonstrations([path], ["scripted"], 0)
    assert len(demos.sessions) == 1 and demos.skipped == {"a session without output tokens": 1}


def test_a_run_directory_a_journal_directory_and_the_file_all_name_the_journal(tmp_path: Path) -> None:
    path = journal(tmp_path / "run" / "journal", chain("s", [([1], [2])]))
    assert (
        journal_file(tmp_path / "run")
        == journal_file(tmp_path / "run" / "journal")
        == journal_file(path)
        == path
    )
    with pytest.raises(ConfigError, match="does not exist"):
        journal_file(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"holds no calls\.jsonl"):
        journal_file(tmp_path)


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = journal(tmp_path, chain("s", [([1], [2]), ([3], [4])]))
    whole = path.read_bytes()
    with open(path, "ab") as f:  # a crash mid-write
        f.write(whole[: len(whole) // 3])
    assert load_demonstrations([path], ["scripted"], 0).calls == 2


def test_a_damaged_line_before_the_last_names_the_file_and_line(tmp_path: Path) -> None:
    path = journal(tmp_path, chain("s", [([1], [2]), ([3], [4])]))
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + lines[1][:20] + b"\n" + lines[1])
    with pytest.raises(ConfigError, match=r"calls.jsonl, line 2 is not a JSON record"):
        load_demonstrations([path], ["scripted"], 0)


def test_a_line_that_is_not_a_call_record_says_what_it_is(tmp_path: Path) -> None:
    path = journal(tmp_path, chain("s", [([1], [2])]))
    api = ApiCallRecord(call_id="x", session="s", role="main", endpoint="chat/completions", request={},
                        response={}, prompt_tokens=0, completion_tokens=0, timing=TIMING)  # fmt: skip
    with open(path, "ab") as f:
        f.write(msgspec.json.encode(api) + b"\n")
    with pytest.raises(ConfigError, match="line 2: an outside model's text-only call"):
        load_demonstrations([path], ALL, 0)
    path.write_bytes(b'{"call_id": "x"}\n')
    with pytest.raises(ConfigError, match="line 1: not a call record"):
        load_demonstrations([path], ALL, 0)


def test_no_demonstrations_says_what_the_journal_holds_and_how_to_accept_it(tmp_path: Path) -> None:
    path = journal(tmp_path, chain("p", [([1], [2]), ([3], [4])], source="policy"))
    with pytest.raises(
        ConfigError, match=r"call records found: 2 policy; accepted sources: scripted.*--all-sources"
    ):
        load_demonstrations([path], ["scripted"], 0)
    with pytest.raises(ConfigError, match="no demonstration journals"):
        load_demonstrations([], ["scripted"], 0)


def test_every_epoch_takes_every_session_once_in_its_own_seeded_order() -> None:
    plan = list(batches(10, 4, 3, seed=7))
    assert [len(b) for _, b in plan] == [4, 4, 2] * 3
    epochs = [[i for e, b in plan if e == epoch for i in b] for epoch in range(3)]
    assert all(sorted(order) == list(range(10)) for order in epochs)
    assert len({tuple(order) for order in epochs}) == 3
    assert plan == list(batches(10, 4, 3, seed=7)) != list(batches(10, 4, 3, seed=8))


def test_the_sft_section_checks_its_fields() -> None:
    cfg = load_config(None, ['sft.journals=["runs/a"]', 'sft.sources=["scripted", "policy"]', "sft.epochs=3"])
    assert (
        cfg.sft.journals == ["runs/a"] and cfg.sft.sources == ["scripted", "policy"] and cfg.sft.epochs == 3
    )
    assert load_config().sft.sources == ["scripted"]
    with pytest.raises(ConfigError, match=r"sft.sources"):
        load_config(None, ['sft.sources=["experts"]'])
    with pytest.raises(ConfigError, match=r"sft.epochs"):
        load_config(None, ["sft.epochs=-1"])
    assert (
        load_config(None, ["sft.epochs=0"]).sft.epochs == 0
    )  # the window stage alone (run_sft checks there is one)

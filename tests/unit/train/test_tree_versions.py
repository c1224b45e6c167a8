"""gyre.train.prefixtree: every sampled token carries the weight version that sampled it, also within one call."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gyre.journal.records import CallRecord, CallTiming
from gyre.train.prefixtree import TrajectoryTree

TIMING = CallTiming(submitted_s=0.0, first_token_s=None, finished_s=0.0)


def _call(i: int, new_input: list[int], output: list[int], versions: list[int]) -> CallRecord:
    return CallRecord(call_id=f"c{i}", session="s", role="main", new_input_ids=new_input, output_ids=output,
                      output_logprobs=[-1.0] * len(output), finish_reason="stop",
                      weight_version=versions[0] if versions else 0, cell="e",
                      timing=TIMING, output_versions=versions)  # fmt: skip


def _sampled_versions(tree: TrajectoryTree) -> dict[tuple[int, ...], int]:
    """Prefix ending at each sampled token -> that token's version."""
    out: dict[tuple[int, ...], int] = {}
    for node in tree.nodes():
        path = [t for n in node.path() for t in n.tokens]
        for j, (sampled, version) in enumerate(zip(node.sampled, node.versions, strict=True)):
            if sampled:
                out[tuple(path[: node.depth + j + 1])] = version
            else:
                assert version == -1
    return out


def test_a_moved_calls_tokens_keep_their_versions_where_calls_share_tokens() -> None:
    first = _call(0, [1, 2, 3], [4, 5, 6], [3, 3, 4])  # moved from a version-3 engine to a version-4 one
    # a retry whose output runs along the first call's context (3) and output (4), then branches (7)
    second = _call(1, [1, 2], [3, 4, 7], [5, 6, 6])
    assert _sampled_versions(TrajectoryTree([first, second])) == {
        (1, 2, 3): 5,  # context of the first call, sampled by the second
        (1, 2, 3, 4): 3,  # sampled by both: the first call's, with its logprob
        (1, 2, 3, 4, 5): 3,
        (1, 2, 3, 4, 5, 6): 4,
        (1, 2, 3, 4, 7): 6,
    }


calls = st.lists(
    st.tuples(
        st.lists(st.integers(0, 2), min_size=1, max_size=4),
        st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), max_size=5),
    ),
    min_size=1,
    max_size=6,
)


@given(calls)
def test_each_sampled_token_has_the_version_of_the_first_call_that_sampled_it(
    drawn: list[tuple[list[int], list[tuple[int, int]]]],
) -> None:
    records = [_call(i, new, [t for t, _ in out], [v for _, v in out]) for i, (new, out) in enumerate(drawn)]
    expected: dict[tuple[int, ...], int] = {}
    for record in records:
        seq = record.new_input_ids + record.output_ids
        for j, version in enumerate(record.token_versions()):
            expected.setdefault(tuple(seq[: len(record.new_input_ids) + j + 1]), version)
    assert _sampled_versions(TrajectoryTree(records)) == expected

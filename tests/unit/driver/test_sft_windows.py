"""The window stage's examples: a window ends at each demonstrated output (or each span it copies from what it was
just shown), holds at most ``window_tokens`` tokens at their true positions, trains that output or span only, starts
somewhere new every time it is drawn, and left padding changes no trained token's loss."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from test_sft_demonstrations import chain

from gyre.driver.sft import Window, copied_spans, cut_windows, pad_windows, window_batches, window_gradients
from gyre.journal.records import expand_inputs

PROMPT = list(range(30, 60))
SESSIONS = [
    chain("a", [([*PROMPT, 1, 2], [20, 21, 22]), ([3, 4], [23, 24]), ([5], [25, 26, 27, 28, 29, 30, 31])]),
    chain("b", [([7], [8, 9])]),
]


def test_a_window_ends_at_each_output_and_holds_its_last_tokens_at_their_true_positions() -> None:
    windows = cut_windows(SESSIONS, window_tokens=8)
    expected = []
    for index, records in enumerate(SESSIONS):
        full = expand_inputs(records)
        for r in records:
            conversation = full[r.call_id] + r.output_ids
            expected.append((index, conversation[-8:], max(len(conversation) - 8, 0), r.output_ids))
    assert len(windows) == len(expected) == 4
    for w, (session, tokens, start, output) in zip(windows, expected, strict=True):
        assert (w.session, w.input_ids, w.start) == (session, tokens, start)
        assert len(w.input_ids) <= 8 and w.input_ids[len(w.input_ids) - w.trained :] == output[-w.trained :]
    assert [w.start for w in windows[:3]] == [27, 31, 39]  # the conversation ends at 35, 39 and 47 tokens
    assert windows[0].input_ids == [57, 58, 59, 1, 2, 20, 21, 22]
    assert [w.trained for w in windows] == [3, 2, 7, 2]
    assert windows[3] == Window(session=1, input_ids=[7, 8, 9], start=0, trained=2, least=3)  # shorter
    assert [w.least for w in windows] == [35, 4, 8, 3]  # back to where the call's new input starts

    short = cut_windows(SESSIONS, window_tokens=4)  # an output longer than the window: its last tokens
    assert short[2].input_ids == [28, 29, 30, 31] and short[2].trained == 3
    assert cut_windows([chain("c", [([], [5])])], window_tokens=8) == []  # nothing to predict it from


def test_a_drawn_window_starts_anywhere_from_its_latest_observation_back_and_keeps_true_positions() -> None:
    (window,) = [w for w in cut_windows(SESSIONS, window_tokens=12) if w.start == 35]  # the third call's
    assert (window.least, len(window.input_ids), window.trained) == (8, 12, 7)
    rng = random.Random(0)
    drawn = [window.draw(rng) for _ in range(200)]
    assert {len(d.input_ids) for d in drawn} == set(range(8, 13))  # never cuts into the observation
    for d in drawn:
        cut = len(window.input_ids) - len(d.input_ids)
        assert d.input_ids == window.input_ids[cut:] and d.start == window.start + cut and d.trained == 7
    tight = Window(session=0, input_ids=[1, 2, 3], start=5, trained=2, least=1)
    assert all(len(tight.draw(rng).input_ids) == 3 for _ in range(20))  # a trained token keeps its context


def test_copied_spans_are_the_runs_of_an_output_found_in_its_observation() -> None:
    observation = [90, 91, 5, 6, 7, 92, 93, 8, 9]
    assert copied_spans([1, 2, 5, 6, 7, 3, 8, 9, 4], observation, least=3) == [(2, 5, 2)]
    assert copied_spans([1, 2, 5, 6, 7, 3, 8, 9, 4], observation, least=2) == [(2, 5, 2), (6, 8, 7)]
    assert copied_spans([5, 6, 7, 92, 93], observation, least=3) == [(0, 5, 2)]  # one run, however long
    assert copied_spans([8, 9, 0], [8, 9, 0, 1, 8, 9, 0], least=3) == [(0, 3, 4)]  # its last showing
    assert copied_spans([1, 2, 3], observation, least=3) == [] and copied_spans([5, 6], observation, 3) == []


def test_copied_focus_trains_each_copied_span_in_a_window_ending_at_it() -> None:
    # the second call is shown [70, 71, 72, 73] and copies [71, 72, 73] into the middle of its output
    session = chain("c", [([*PROMPT, 1], [20, 21]), ([70, 71, 72, 73], [24, 71, 72, 73, 25])])
    windows = cut_windows([session], window_tokens=16, focus=["copied"])
    copy = [w for w in windows if w.start > 0]
    assert len(copy) == 1 and copy[0].input_ids[-4:] == [24, 71, 72, 73] and copy[0].trained == 3
    assert copy[0].least == 7 and copy[0].start + len(copy[0].input_ids) == 31 + 2 + 4 + 4  # ends at the name
    assert cut_windows([session], window_tokens=16, focus=["copied"], copy_min=5) == []  # no 5-token copy
    assert cut_windows([session], window_tokens=6, focus=["copied"]) == []  # its source is 7 tokens back
    both = cut_windows([session], window_tokens=16, focus=["output", "copied"])
    assert both == [*cut_windows([session], window_tokens=16)[:2], copy[0]]  # output windows, then the copy's


def test_a_batch_is_left_padded_with_true_positions_and_trains_the_outputs_only() -> None:
    windows = [Window(session=0, input_ids=[5, 6, 7, 8], start=40, trained=2),
               Window(session=1, input_ids=[9, 10], start=0, trained=1)]  # fmt: skip
    ids, mask, positions, trained = pad_windows(windows, pad_id=99)
    assert ids.tolist() == [[5, 6, 7, 8], [99, 99, 9, 10]]
    assert mask.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    assert positions[0].tolist() == [40, 41, 42, 43] and positions[1, 2:].tolist() == [0, 1]
    assert trained.tolist() == [[False, False, True, True], [False, False, False, True]]


def test_every_pass_draws_every_window_once_in_its_own_seeded_order() -> None:
    plan = list(window_batches(10, 4, 5, seed=3))  # 20 windows drawn: two passes, the third step spans both
    assert [p for p, _ in plan] == [0, 0, 0, 1, 1] and all(len(b) == 4 for _, b in plan)
    drawn = [i for _, b in plan for i in b]
    assert sorted(drawn[:10]) == sorted(drawn[10:]) == list(range(10)) and drawn[:10] != drawn[10:]
    assert plan == list(window_batches(10, 4, 5, seed=3)) != list(window_batches(10, 4, 5, seed=4))
    assert [len(b) for _, b in window_batches(3, 8, 2, seed=0)] == [8, 8]  # a batch larger than the windows


def test_the_batched_loss_is_the_mean_over_windows_of_each_ones_nll_computed_alone(hf_model: Any) -> None:
    windows = cut_windows(SESSIONS, window_tokens=12)
    try:
        stats = window_gradients(hf_model, windows, pad_id=hf_model.config.pad_token_id)
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in hf_model.parameters())
    finally:
        hf_model.zero_grad(set_to_none=True)
    means: list[float] = []
    with torch.no_grad():
        for w in windows:  # one at a time, unpadded, positions from w.start
            positions = torch.arange(w.start, w.start + len(w.input_ids))[None]
            logits = hf_model(input_ids=torch.tensor([w.input_ids]), position_ids=positions).logits[0]
            logprobs, n = logits.log_softmax(-1), len(w.input_ids)
            nll = [-float(logprobs[p - 1, w.input_ids[p]]) for p in range(n - w.trained, n)]
            means.append(sum(nll) / len(nll))
    assert stats.tokens == sum(w.trained for w in windows) and len({w.trained for w in windows}) > 1
    assert stats.computed_tokens == sum(len(w.input_ids) for w in windows)
    assert stats.loss == pytest.approx(sum(means) / len(means), abs=1e-5)  # each window weighs the same

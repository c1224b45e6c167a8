"""The window stage's examples: a window ends at each demonstrated output, holds at most ``window_tokens`` tokens
at their true positions, trains that output only, and left padding changes no trained token's loss."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_sft_demonstrations import chain

from gyre.records import expand_inputs
from gyre.sft import Window, cut_windows, pad_windows, window_batches, window_gradients

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
    assert windows[3] == Window(session=1, input_ids=[7, 8, 9], start=0, trained=2)  # shorter than the window

    short = cut_windows(SESSIONS, window_tokens=4)  # an output longer than the window: its last tokens
    assert short[2].input_ids == [28, 29, 30, 31] and short[2].trained == 3
    assert cut_windows([chain("c", [([], [5])])], window_tokens=8) == []  # nothing to predict it from


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


def test_the_batched_loss_is_the_mean_nll_of_each_windows_output_computed_alone(hf_model: Any) -> None:
    windows = cut_windows(SESSIONS, window_tokens=12)
    try:
        stats = window_gradients(hf_model, windows, pad_id=hf_model.config.pad_token_id)
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in hf_model.parameters())
    finally:
        hf_model.zero_grad(set_to_none=True)
    nll: list[float] = []
    with torch.no_grad():
        for w in windows:  # one at a time, unpadded, positions from w.start
            positions = torch.arange(w.start, w.start + len(w.input_ids))[None]
            logits = hf_model(input_ids=torch.tensor([w.input_ids]), position_ids=positions).logits[0]
            logprobs, n = logits.log_softmax(-1), len(w.input_ids)
            nll += [-float(logprobs[p - 1, w.input_ids[p]]) for p in range(n - w.trained, n)]
    assert stats.tokens == len(nll) == sum(w.trained for w in windows)
    assert stats.computed_tokens == sum(len(w.input_ids) for w in windows)
    assert stats.loss == pytest.approx(sum(nll) / len(nll), abs=1e-5)

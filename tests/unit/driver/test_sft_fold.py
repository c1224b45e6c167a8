"""Folding a step's demonstration sessions into prefix trees: each demonstrated token trained once, with equal
weight, the shared prompt computed once, and the loss the plain mean NLL of the demonstrated tokens."""

from __future__ import annotations

from typing import Any

import torch
from test_sft_demonstrations import chain

from gyre.driver.sft import fold
from gyre.journal.records import CallRecord, expand_inputs
from gyre.train.loss import token_logprobs
from gyre.train.prefixtree import TrajectoryTree

PROMPT = list(range(30, 90))  # what every session starts with (the agent's system prompt)
SESSIONS = [
    chain("a", [([*PROMPT, 1, 2], [20, 21, 22]), ([3, 4], [23, 24])]),
    chain("b", [([*PROMPT, 5], [25, 26]), ([6], [27, 28, 29])]),
    chain("c", [([*PROMPT, 7, 8, 9], [10, 11])]),
]


def test_every_demonstrated_token_weighs_the_same_and_a_step_weighs_1() -> None:
    micro_steps = fold(SESSIONS, token_budget=10_000)
    weights = [w for m in micro_steps for w in m.weights if w > 0]
    assert len(weights) == sum(len(r.output_ids) for s in SESSIONS for r in s) == 12
    assert len(set(weights)) == 1 and abs(sum(weights) - 1.0) < 1e-12
    assert all(m.objective == "supervised" for m in micro_steps)


def test_an_output_shared_under_the_same_context_is_trained_once() -> None:
    twice = [chain("x", [([*PROMPT, 1], [2, 3])]), chain("y", [([*PROMPT, 1], [2, 3]), ([4], [5])])]
    weights = [w for m in fold(twice, token_budget=10_000) for w in m.weights if w > 0]
    assert len(weights) == 3


def test_sessions_sharing_a_prompt_compute_it_once_within_the_budget() -> None:
    together = fold(SESSIONS, token_budget=10_000)
    every: list[CallRecord] = [r for s in SESSIONS for r in s]
    assert len(together) == 1 and len(together[0].input_ids) == TrajectoryTree(every).size
    apart = sum(TrajectoryTree(s).size for s in SESSIONS)
    assert len(together[0].input_ids) < apart - len(PROMPT)

    budget = TrajectoryTree([*SESSIONS[0], *SESSIONS[1]]).size  # room for two, not three
    split = fold(SESSIONS, token_budget=budget)
    assert sorted(len(m.input_ids) for m in split) == sorted([budget, TrajectoryTree(SESSIONS[2]).size])
    one_each = fold(SESSIONS, token_budget=1)  # each longer than the budget: a sequence of its own
    assert sum(m.sequences for m in one_each) == 3 and sum(len(m.input_ids) for m in one_each) == apart


def test_the_folded_loss_is_the_mean_nll_of_the_demonstrated_tokens(hf_model: Any) -> None:
    with torch.no_grad():
        folded = -sum(
            float((torch.tensor(m.weights) * token_logprobs(hf_model, m)).sum())
            for m in fold(SESSIONS, token_budget=10_000)
        )
        nll: list[float] = []  # each session as one plain causal sequence: its last call's input and output
        for records in SESSIONS:
            full = expand_inputs(records)
            last = records[-1]
            ids = torch.tensor([full[last.call_id] + last.output_ids])
            logprobs = hf_model(input_ids=ids).logits[0].log_softmax(-1)
            for r in records:
                start = len(full[r.call_id])
                nll += [-float(logprobs[p - 1, t]) for p, t in enumerate(r.output_ids, start)]
    assert abs(folded - sum(nll) / len(nll)) < 1e-4

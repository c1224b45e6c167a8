"""Context parallelism scores only the tokens a loss reads: with most tokens context (no loss weight) and one rank
holding none of the weighted tokens' parents, 2 gloo ranks still give the loss and every gradient of one process
(the rank with nothing to score runs its backward's collectives all the same)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
import torch
import torch.multiprocessing as mp

from context_ranks import run_rank, tree_micro_step
from gyre.config import LossConfig
from gyre.engine.launcher import free_port
from gyre.train.context import ContextSplit
from gyre.train.objective import compute_gradients
from gyre.train.state import flat_gradient, load_model


@pytest.mark.slow(
    reason="two ranks on an edge case (12 s); the fast tier splits a tree over ranks (test_context_parallel)"
)
def test_a_rank_with_no_weighted_tokens_still_gives_the_micro_steps_loss_and_gradients(
    tiny_model: Path, tmp_path: Path
) -> None:
    tokens, world = 1536, 2
    micro = tree_micro_step(7, tokens, 6)
    held = set(ContextSplit.of(tokens, world).owned[0])
    # one token in 7 weighted (an agent's generated tokens), and only where rank 0 holds the parent
    weights = [w if i % 7 == 3 and micro.parents[i] in held else 0.0 for i, w in enumerate(micro.weights)]
    micro = msgspec.structs.replace(micro, weights=weights)
    mp.start_processes(run_rank, args=(world, free_port(), str(tiny_model), msgspec.json.encode(micro).decode(),
                                       str(tmp_path)), nprocs=world, start_method="forkserver")  # fmt: skip
    got = torch.load(tmp_path / "gradient.pt")
    loss, scored, computed = json.loads((tmp_path / "figures.json").read_text())
    model = load_model(tiny_model)  # the same micro-step in one process
    want_loss = compute_gradients(model, micro, LossConfig(), 0).loss
    want = flat_gradient(model).double()
    assert computed == tokens and scored == sum(1 for w in weights if w > 0) > 0
    assert abs(loss - want_loss) <= 1e-5 * abs(want_loss) + 1e-8, (loss, want_loss)
    worst = float((got - want).abs().max())
    assert worst <= 1e-5 * float(want.abs().max()), (worst, float(want.abs().max()))

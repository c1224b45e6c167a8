"""Context parallelism over gloo: a tree-packed micro-step with branches computed by 2 and 4 ranks together gives
the loss and every gradient of one process computing it whole."""

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
from gyre.train.objective import compute_gradients
from gyre.train.state import flat_gradient, load_model


def unsplit(model_dir: Path, micro: object) -> tuple[torch.Tensor, float]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = load_model(model_dir)
        stats = compute_gradients(model, micro, LossConfig(), 0)
        return flat_gradient(model).double(), stats.loss
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(
    "world,tokens,branches",
    [
        (2, 1536, 6),
        pytest.param(2, 16384, 24, marks=pytest.mark.slow(reason="a 16K-token tree on 2 ranks")),
        pytest.param(4, 16384, 24, marks=pytest.mark.slow(reason="a 16K-token tree on 4 ranks")),
    ],
)
def test_a_tree_split_over_ranks_gives_the_loss_and_gradients_of_one_process(
    tiny_model: Path, tmp_path: Path, world: int, tokens: int, branches: int
) -> None:
    micro = tree_micro_step(world * 100 + branches, tokens, branches)
    mp.start_processes(run_rank, args=(world, free_port(), str(tiny_model), msgspec.json.encode(micro).decode(),
                                       str(tmp_path)), nprocs=world, start_method="forkserver")  # fmt: skip
    got = torch.load(tmp_path / "gradient.pt")
    loss, scored, computed = json.loads((tmp_path / "figures.json").read_text())
    want, want_loss = unsplit(tiny_model, micro)
    assert computed == tokens  # every token through exactly one rank's forward
    assert scored == sum(1 for w in micro.weights if w > 0)  # every weighted token scored by exactly one rank
    assert abs(loss - want_loss) <= 1e-5 * abs(want_loss) + 1e-8, (loss, want_loss)
    worst = float((got - want).abs().max())
    assert worst <= 1e-5 * float(want.abs().max()), (worst, float(want.abs().max()))

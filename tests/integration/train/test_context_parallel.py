"""Context parallelism over gloo: a tree-packed micro-step with branches computed by 2 and 4 ranks together (keys and
values passed around the ring) gives the loss and every gradient of one process computing it whole, with the tiny
model's 2 query heads a key/value head and with 4."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
import torch
import torch.multiprocessing as mp

from context_ranks import grouped_model, run_rank, tree_micro_step
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


@pytest.fixture(scope="module")
def four_to_one(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny shape with one key/value head for its 4 query heads."""
    return grouped_model(tmp_path_factory.mktemp("models") / "tiny-gqa4", kv_heads=1)


@pytest.mark.parametrize(
    "world,tokens,branches,groups",
    [
        (2, 1536, 6, 2),
        (3, 1536, 6, 4),
        pytest.param(2, 16384, 24, 2, marks=pytest.mark.slow(reason="a 16K-token tree on 2 ranks")),
        pytest.param(4, 16384, 24, 2, marks=pytest.mark.slow(reason="a 16K-token tree on 4 ranks")),
        pytest.param(
            4, 4096, 12, 4, marks=pytest.mark.slow(reason="a 4K-token tree on 4 ranks, 4 heads a k/v")
        ),
    ],
)
def test_a_tree_split_over_ranks_gives_the_loss_and_gradients_of_one_process(
    tiny_model: Path, four_to_one: Path, tmp_path: Path, world: int, tokens: int, branches: int, groups: int
) -> None:
    model_dir = tiny_model if groups == 2 else four_to_one
    micro = tree_micro_step(world * 100 + branches, tokens, branches)
    mp.start_processes(run_rank, args=(world, free_port(), str(model_dir), msgspec.json.encode(micro).decode(),
                                       str(tmp_path)), nprocs=world, start_method="forkserver")  # fmt: skip
    got = torch.load(tmp_path / "gradient.pt")
    loss, scored, computed = json.loads((tmp_path / "figures.json").read_text())
    want, want_loss = unsplit(model_dir, micro)
    assert computed == tokens  # every token through exactly one rank's forward
    assert scored == sum(1 for w in micro.weights if w > 0)  # every weighted token scored by exactly one rank
    assert abs(loss - want_loss) <= 1e-5 * abs(want_loss) + 1e-8, (loss, want_loss)
    worst = float((got - want).abs().max())
    assert worst <= 1e-5 * float(want.abs().max()), (worst, float(want.abs().max()))

"""Activation checkpointing (``trainer.activation_checkpointing``): recomputed decoder layers give the loss and every
gradient of kept ones, on a chain and on a tree (whose attention reads its segments from a context variable), and the
option reaches every model a trainer computes with."""

from __future__ import annotations

from pathlib import Path

import pytest

from context_ranks import tree_micro_step
from gyre.config import LossConfig, TrainerConfig, load_config
from gyre.errors import ConfigError
from gyre.train import recompute
from gyre.train.learner import make_learner
from gyre.train.objective import compute_gradients
from gyre.train.state import TrainState, flat_gradient
from recompute_runs import model


@pytest.mark.parametrize("branches", [0, 3], ids=["chain", "tree"])
def test_recomputed_layers_give_the_loss_and_gradients_of_kept_ones(branches: int) -> None:
    micro = tree_micro_step(7, 256, branches, vocab=1024)
    kept, recomputed = model("tiny", 1024, 2), model("tiny", 1024, 2)
    recompute.enable(recomputed)
    want = compute_gradients(kept, micro, LossConfig(), 0)
    got = compute_gradients(recomputed, micro, LossConfig(), 0)
    assert recompute.enabled(recomputed) and not recompute.enabled(kept)
    assert abs(got.loss - want.loss) <= 1e-6 * abs(want.loss), (got.loss, want.loss)
    g, w = flat_gradient(recomputed), flat_gradient(kept)
    assert float((g - w).abs().max()) <= 1e-6 * float(w.abs().max())


def test_the_option_reaches_the_core_and_satellites(tiny_model: Path) -> None:
    state = TrainState(TrainerConfig(model_path=str(tiny_model), activation_checkpointing=True))
    assert recompute.enabled(state.model)
    config = state.model.config.to_dict()
    assert recompute.enabled(make_learner("torch", config, activation_checkpointing=True).model)  # type: ignore[attr-defined]
    assert not recompute.enabled(make_learner("torch", config).model)  # type: ignore[attr-defined]


def test_the_megatron_backend_refuses_it() -> None:
    with pytest.raises(ConfigError, match="activation_checkpointing"):
        load_config(None, ["trainer.backend=megatron", "trainer.activation_checkpointing=true"])
    with pytest.raises(ConfigError, match="activation_checkpointing"):
        make_learner("megatron", {}, activation_checkpointing=True)

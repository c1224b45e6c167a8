"""gyre.train.memory: the accounting matches the tensors today's core holds, and projects published Qwen3 sizes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gyre.engine.models import count_parameters, init_model
from gyre.train.memory import (
    ASSUMPTIONS,
    BF16,
    FP32,
    GIB,
    CellLayout,
    ModelShape,
    device_memory,
    gradient_traffic,
    held_bytes,
    max_micro_tokens,
)

QWEN3_8B = {  # Qwen/Qwen3-8B config.json
    "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
    "tie_word_embeddings": False,
}  # fmt: skip
QWEN3_235B = {  # Qwen/Qwen3-235B-A22B config.json
    "model_type": "qwen3_moe", "hidden_size": 4096, "num_hidden_layers": 94, "num_attention_heads": 64,
    "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 12288, "moe_intermediate_size": 1536,
    "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "vocab_size": 151936, "tie_word_embeddings": False,
}  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("models") / "tiny")


def test_importing_does_not_import_torch() -> None:
    code = "import sys, gyre.train.memory; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_parameter_count_of_a_written_model_is_exact(tiny: Path) -> None:
    shape = ModelShape.from_config(json.loads((tiny / "config.json").read_text()))
    assert shape.parameters() == count_parameters(tiny)


def test_published_qwen3_sizes() -> None:
    assert ModelShape.from_config(QWEN3_8B).parameters() / 1e9 == pytest.approx(8.19, abs=0.01)
    moe = ModelShape.from_config(QWEN3_235B)
    assert moe.parameters() / 1e9 == pytest.approx(235.1, abs=0.1)
    assert moe.parameters(active=True) / 1e9 == pytest.approx(22.2, abs=0.1)


def test_prediction_matches_the_tensors_of_todays_core(tiny: Path) -> None:
    """Weights, gradients (the core's .grad and its float64 step sum) and AdamW moments of a real TrainState after
    one update and one micro-step's backward, within 2% of what the accounting predicts for one rank."""
    from gyre.config import TrainerConfig
    from gyre.protocol import MicroStep
    from gyre.train.objective import compute_gradients
    from gyre.train.state import TrainState

    state = TrainState(TrainerConfig(model_path=str(tiny)))
    state.apply()  # AdamW's moments now exist
    n = 16
    micro = MicroStep(input_ids=list(range(n)), position_ids=list(range(n)), parents=[-1, *range(n - 1)],
                      weights=[0.0] + [1 / (n - 1)] * (n - 1), advantages=[1.0] * n, behaviour_logprobs=[-5.0] * n,
                      versions=[0] * n, sequences=1)  # fmt: skip
    compute_gradients(state.model, micro, state.cfg.loss, state.version)
    measured = held_bytes(state.model, state.optimizer, state.gradient_sum)

    shape = ModelShape.from_config(state.model.config.to_dict())
    predicted = device_memory(shape, CellLayout(), FP32, design="star", engine_bytes=4, receive_buffers=0)
    assert measured["weights"] == pytest.approx(predicted.weights, rel=0.02)
    assert measured["gradients"] == pytest.approx(predicted.gradients, rel=0.02)
    assert measured["moments"] == pytest.approx(predicted.moments + predicted.master, rel=0.02)


def test_sharding_divides_optimizer_and_sum_by_shards() -> None:
    shape = ModelShape.from_config(QWEN3_8B)
    one = device_memory(shape, CellLayout(), BF16)
    eight = device_memory(shape, CellLayout(shards=8), BF16)
    assert eight.moments == pytest.approx(one.moments / 8, rel=1e-6)
    assert eight.master == pytest.approx(one.master / 8, rel=1e-6)
    assert eight.weights == one.weights  # ZeRO-1: weights stay whole on every rank


def test_qwen3_8b_fits_one_cell_with_64k_micro_steps_only_sharded() -> None:
    shape = ModelShape.from_config(QWEN3_8B)
    star = device_memory(shape, CellLayout(tensor=8), BF16, 65536, design="star")
    assert not star.fits and star.state > 100 * GIB  # ~16 bytes a parameter and more in one process
    layout = CellLayout(tensor=8)
    assert device_memory(shape, layout, BF16, 65536).fits
    assert max_micro_tokens(shape, layout) >= 65536


def test_235b_moe_does_not_fit_one_cell() -> None:
    shape = ModelShape.from_config(QWEN3_235B)
    assert not device_memory(shape, CellLayout(tensor=8), BF16, 4096).fits


def test_star_traffic_grows_with_micro_steps_reduce_scatter_does_not() -> None:
    shape = ModelShape.from_config(QWEN3_8B)
    few = gradient_traffic(shape, CellLayout(shards=8), BF16, remote_micro_steps=4, satellites=8)
    many = gradient_traffic(shape, CellLayout(shards=8), BF16, remote_micro_steps=64, satellites=8)
    assert many.star == 16 * few.star
    assert many.reduce_scatter == few.reduce_scatter <= 2 * few.model_gradient


def test_layout_that_cannot_split_the_model_is_refused() -> None:
    with pytest.raises(ValueError, match="attention heads"):
        device_memory(ModelShape.from_config(QWEN3_8B), CellLayout(tensor=3), BF16)


def test_tensor_and_pipeline_parts_cover_the_model() -> None:
    shape = ModelShape.from_config(QWEN3_8B)
    assert shape.device_parameters(1, 1) == shape.parameters()
    assert shape.device_parameters(8, 1) == pytest.approx(shape.parameters() / 8, rel=0.01)
    stage = shape.device_parameters(1, 4)  # 9 layers and the embedding or the lm_head
    assert shape.parameters() / 4 < stage < shape.parameters() / 3


def test_assumptions_are_printed_from_the_docstring() -> None:
    assert [a.split(".")[0] for a in ASSUMPTIONS] == [str(i) for i in range(1, 10)]


def _saved_bytes_per_token_layer(tiny: Path, kv_heads: int, tokens: int = 512) -> tuple[float, ModelShape]:
    """Bytes Hugging Face's Qwen3 keeps for backward (``saved_tensors_hooks``, each storage once, parameters not
    counted) per token and decoder layer through gyre's tree-attention loss: the difference of 4 and 2 layers."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from gyre.config import LossConfig
    from gyre.protocol import MicroStep
    from gyre.train.objective import compute_gradients

    kept = {}
    for layers in (2, 4):
        config = AutoConfig.from_pretrained(tiny, local_files_only=True)
        config.num_key_value_heads, config.num_hidden_layers = kv_heads, layers
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).train()
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        storages: dict[int, int] = {}

        def pack(
            t: torch.Tensor, params: set[int] = params, storages: dict[int, int] = storages
        ) -> torch.Tensor:
            if t.untyped_storage().data_ptr() not in params:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        n = tokens
        micro = MicroStep(input_ids=[i % 200 for i in range(n)], position_ids=list(range(n)),
                          parents=[-1, *range(n - 1)], weights=[0.0] + [1 / (n - 1)] * (n - 1), advantages=[1.0] * n,
                          behaviour_logprobs=[-5.0] * n, versions=[0] * n, sequences=1)  # fmt: skip
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            compute_gradients(model, micro, LossConfig(), 0)
        kept[layers] = sum(storages.values())
    return (kept[4] - kept[2]) / 2 / tokens, ModelShape.from_config(config.to_dict())


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_activations_are_the_tensors_the_model_keeps_with_grouped_heads(tiny: Path, kv_heads: int) -> None:
    """The activation term per token and layer is what the tiny model keeps for backward, with 2 query heads a
    key/value head and with 4: grouped keys and values counted once, as the attention keeps them (not repeated)."""
    measured, shape = _saved_bytes_per_token_layer(tiny, kv_heads)
    values, fp32 = shape.activation_values_per_token_layer(False)
    assert measured == pytest.approx(values * FP32.activation + fp32 * 4, rel=0.01)

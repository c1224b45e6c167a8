"""gyre.train.layout: a core cell layout that does not fit the model, the backend or the cell's machine is refused
before anything starts, saying what does not fit and what would; `gyre train` and the Python API refuse it too."""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import pytest

from gyre.cli import main
from gyre.config import TrainerConfig, load_config
from gyre.driver.training import Trainer
from gyre.errors import ConfigError
from gyre.train.layout import check_layout, describe_layout
from gyre.train.memory import GIB

QWEN3_8B = {  # Qwen/Qwen3-8B config.json
    "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
    "tie_word_embeddings": False,
}  # fmt: skip


def trainer(**fields: object) -> TrainerConfig:
    return msgspec.convert(fields, TrainerConfig)


def refusal(cfg: TrainerConfig, *args: object, **kwargs: object) -> str:
    with pytest.raises(ConfigError) as info:
        check_layout(cfg, *args, **kwargs)  # type: ignore[arg-type]
    return str(info.value)


def test_tensor_parallel_that_does_not_divide_the_heads_is_refused_naming_them() -> None:
    why = refusal(trainer(backend="megatron", tensor_parallel=3), QWEN3_8B, cpus=16)
    assert "tensor = 3 does not divide the 32 attention heads" in why
    # Megatron also splits the 8 key/value heads, the MLP width and the vocabulary: these are what would fit
    assert "tensor_parallel values that fit: 1, 2, 4, 8;" in why
    why = refusal(trainer(backend="megatron", pipeline_parallel=5), QWEN3_8B, cpus=16)
    assert (
        "does not divide the model's 36 layers" in why
        and "pipeline_parallel values that fit: 1, 2, 3, 4, 6" in why
    )


def test_shards_on_the_megatron_backend_are_refused_as_not_built() -> None:
    why = refusal(trainer(backend="megatron", ranks=2), QWEN3_8B, cpus=16)
    assert "trainer.ranks = 2 with trainer.backend = 'megatron'" in why
    assert "set trainer.backend = 'torch'" in why


def test_tensor_parallel_on_the_torch_backend_is_refused() -> None:
    why = refusal(trainer(backend="torch", tensor_parallel=2), QWEN3_8B, cpus=16)
    assert "apply to the Megatron backend only" in why and "trainer.ranks instead" in why


def test_a_layout_that_fits_passes_and_is_described() -> None:
    check_layout(trainer(ranks=4), QWEN3_8B, cpus=1)  # gloo: 4 ranks on one core
    check_layout(trainer(backend="megatron", tensor_parallel=8, pipeline_parallel=2), QWEN3_8B, cpus=2)
    check_layout(trainer(ranks=8, collective="nccl"), QWEN3_8B, 8, device_bytes=141 * GIB)  # H200s
    assert describe_layout(trainer(ranks=4), QWEN3_8B) == (
        "core cell: 4 ranks x tensor 1 x pipeline 1 = 4 rank processes; each holds 1/4 of 8.2 B fp32 master weights, "
        "gradient sum and AdamW moments"
    )


def test_more_ranks_than_the_cells_gpus_or_cpus_is_refused_with_what_fits() -> None:
    why = refusal(trainer(ranks=4, collective="nccl"), QWEN3_8B, 2, device_bytes=80 * GIB)
    assert (
        "needs 4 GPUs over trainer.collective = 'nccl'" in why
        and "the cell has 2; trainer.ranks = 2 fits" in why
    )
    why = refusal(trainer(ranks=17), QWEN3_8B, cpus=2)
    assert "17 rank processes over gloo on 2 CPU cores" in why and "at most 16 ranks" in why


def test_a_sharded_core_whose_state_does_not_fit_a_gpu_is_refused_with_the_ranks_that_would() -> None:
    # per rank, as the cell places it today: an fp32 replica and its gradient (2 x 30.5 GiB), the push bucket (the
    # 1.2 GiB embedding), then 20 B a parameter (fp32 master, fp32 moments, float64 sum) over the ranks
    why = refusal(trainer(ranks=2, collective="nccl"), QWEN3_8B, 8, device_bytes=141 * GIB)
    assert (
        "does not fit a GPU's memory: each rank needs at least 138.5 GiB (30.5 replica, 61.0 gradients" in why
    )
    assert (
        "of 126.9 GiB usable (90% of 141.0 GiB); trainer.ranks = 3 would fit (3 of the cell's 8 GPUs)" in why
    )
    check_layout(trainer(ranks=4, collective="nccl"), QWEN3_8B, 8, device_bytes=141 * GIB)
    # on 80 GB GPUs no cell of one machine holds Qwen3-8B with fp32 replicas: it says so, not "16 ranks would"
    why = refusal(trainer(ranks=8, collective="nccl"), QWEN3_8B, 8, device_bytes=80 * GIB)
    assert "no number of ranks up to the cell's 8 GPUs fits: every rank holds a whole fp32 replica" in why


def test_a_cell_that_cannot_hold_the_longest_micro_step_is_refused_before_anything_starts() -> None:
    """The longest micro-step is the longest context: one rank computes it whole up to max_tokens_per_rank, and past
    it the cell's ranks split it (a rank holds 1/ranks); its activations must fit beside the state."""
    nccl = {"collective": "nccl", "ranks": 8}
    h200 = 141 * GIB
    why = refusal(trainer(**nccl), QWEN3_8B, 8, device_bytes=h200, longest_tokens=131072)
    assert "124.7 activations of 131072 tokens" in why
    assert (
        "one rank computes the longest micro-step (131072 tokens) whole: set trainer.max_tokens_per_rank"
        in why
    )
    check_layout(
        trainer(**nccl, max_tokens_per_rank=32768), QWEN3_8B, 8, device_bytes=h200, longest_tokens=131072
    )
    why = refusal(
        trainer(**nccl, max_tokens_per_rank=32768), QWEN3_8B, 8, device_bytes=h200, longest_tokens=700_000
    )
    assert "activations of 87500 tokens (a rank's share of the longest micro-step, 700000 tokens)" in why
    assert "a rank's share of the longest micro-step (700000 tokens) does not fit beside the state" in why


def _children() -> set[int]:
    """This process's child processes (Linux)."""
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        pids.update(int(p) for p in (task / "children").read_text().split())
    return pids


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A model directory with Qwen3-8B's config.json and no weights: a layout is checked before anything loads."""
    path = tmp_path / "qwen3-8b"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(QWEN3_8B))
    return path


@pytest.mark.parametrize(
    ("trainer_toml", "reason"),
    [
        ('backend = "megatron"\ntensor_parallel = 3', "tensor = 3 does not divide the 32 attention heads"),
        ('backend = "megatron"\nranks = 2', "trainer.ranks = 2 with trainer.backend = 'megatron'"),
    ],
)
def test_gyre_train_refuses_a_bad_layout_and_starts_nothing(
    trainer_toml: str, reason: str, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "run.toml"
    config.write_text(f"[run]\nsteps = 1\n\n[trainer]\n{trainer_toml}\n")
    run_dir = tmp_path / "run"
    before = _children()
    assert main(["train", str(config), "--model", str(model_dir), "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gyre train: error: ") and reason in err
    assert not run_dir.exists() and _children() == before  # no run directory, no cell or trainer process
    # the Python API refuses it the same way
    cfg = load_config(
        config, [f"run.model_path={json.dumps(str(model_dir))}", f"run.run_dir={json.dumps(str(run_dir))}"]
    )
    with pytest.raises(ConfigError, match=reason.replace("'", ".")):
        Trainer(cfg).run()
    assert not run_dir.exists() and _children() == before


def test_gyre_trainer_core_refuses_a_bad_layout(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["trainer", "core", "--model", str(model_dir), "--set", "trainer.tensor_parallel=2"]
    assert main(argv) == 2
    assert "apply to the Megatron backend only" in capsys.readouterr().err


def test_cpu_count_is_this_machines_when_not_given() -> None:
    cores = os.cpu_count() or 1
    check_layout(trainer(ranks=8 * cores), QWEN3_8B)
    assert f"on {cores} CPU cores" in refusal(trainer(ranks=8 * cores + 1), QWEN3_8B)


def test_gpu_count_is_this_machines_when_not_given() -> None:
    import torch

    gpus = torch.cuda.device_count()
    why = refusal(trainer(ranks=gpus + 1, collective="nccl"), QWEN3_8B, device_bytes=80 * GIB)
    assert (
        f"needs {gpus + 1} GPUs over trainer.collective = 'nccl' (one per rank), and this machine has {gpus}"
        in why
    )

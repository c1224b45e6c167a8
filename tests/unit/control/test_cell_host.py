"""What a cell checks on its own machine before it starts anything: an address others can reach, its model copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre.control.cellprocess import CellSpec, check_local
from gyre.errors import ConfigError


def _spec(model: Path) -> CellSpec:
    return CellSpec(name="cell-3", kind="satellite", order=3, controller="tcp://10.0.0.1:5580",
                    model_path=str(model))  # fmt: skip


def test_a_wildcard_host_is_refused_with_what_to_give(tiny_model: Path) -> None:
    with pytest.raises(ConfigError, match="give this machine's address"):
        check_local(_spec(tiny_model), "0.0.0.0")


def test_a_model_missing_on_this_machine_says_each_machine_needs_its_copy(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="every machine needs its own copy of the model directory"):
        check_local(_spec(tmp_path / "models" / "tiny"), "10.0.0.7")


def test_a_reachable_host_and_a_local_model_pass(tiny_model: Path) -> None:
    check_local(_spec(tiny_model), "10.0.0.7")
    check_local(
        _spec(Path("Qwen/Qwen3-8B")), "10.0.0.7", backend="sglang"
    )  # SGLang resolves hub names itself

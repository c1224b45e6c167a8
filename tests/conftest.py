"""Shared fixtures: one tiny model directory per test session, built locally (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

# how the suite runs: longest first, a budget per fast-tier test, hang dumps, leaked processes reaped (suite_plan.py)
pytest_plugins = ["suite_plan"]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly initialised tiny Qwen3 model directory."""
    from gyre.engine.models import init_model

    return init_model(tmp_path_factory.mktemp("models") / "tiny", preset="tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_model_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second tiny model with other weights (for weight updates)."""
    from gyre.engine.models import init_model

    return init_model(tmp_path_factory.mktemp("models") / "tiny-b", preset="tiny", seed=1)


@pytest.fixture
def fresh_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gyre starts its processes as fresh interpreters, as on a user's machine, not from the worker's fork server."""
    monkeypatch.delenv("GYRE_FORKSERVER", raising=False)


@pytest.fixture(scope="session")
def hf_model(tiny_model: Path) -> Any:
    """The same weights in Hugging Face transformers, the reference implementation."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, local_files_only=True, dtype=torch.float32).eval()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every ``slow`` and ``serial`` mark says why (``reason=``): `make test` deselects the slow ones (``-m "not
    slow"``), `make test-all` (CI) runs everything; the serial ones run alone after the parallel pass."""
    for item in items:
        for name, why in (("slow", "it is slow"), ("serial", "it must not share the CPU")):
            for mark in item.iter_markers(name):
                if not str(mark.kwargs.get("reason", "")).strip():
                    raise pytest.UsageError(
                        f"{item.nodeid}: mark it @pytest.mark.{name}(reason=...), saying why {why}"
                    )

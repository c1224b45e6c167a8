"""Engine fixtures: an in-process engine, a served engine process, and the Hugging Face reference model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gyre.config import EngineConfig
from gyre.engine.embedded.asyncengine import EmbeddedEngine
from gyre.engine.launcher import ServerProcess, launch_embedded


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Iterator[EmbeddedEngine]:
    """An in-process embedded engine on the tiny model."""
    eng = EmbeddedEngine(EngineConfig(model_path=str(tiny_model), kv_cache_mem_gib=0.25))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``gyre serve-engine`` on the tiny model, in its own process."""
    log = tmp_path_factory.mktemp("logs") / "engine.log"
    with launch_embedded(tiny_model, overrides=["engine.kv_cache_mem_gib=0.25"], log_path=log) as proc:
        yield proc

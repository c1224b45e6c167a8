"""Sandbox fixtures: a config with small limits per test, its workspaces under the test's own directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre.config import SandboxConfig
from gyre.errors import SandboxError
from gyre.sandbox import check_backend


@pytest.fixture(scope="session")
def bwrap_available() -> None:
    """Skip (saying why) where bubblewrap cannot run; the suite is meant for hosts where it can."""
    try:
        check_backend(SandboxConfig())
    except SandboxError as exc:
        pytest.skip(f"bubblewrap unavailable: {exc}")


@pytest.fixture
def cfg(tmp_path: Path, bwrap_available: None) -> SandboxConfig:
    """Limits small enough to hit quickly; workspaces under this test's own directory."""
    root = tmp_path / "sandboxes"
    root.mkdir()
    return SandboxConfig(
        workspace_root=str(root),
        memory_mib=256,
        max_processes=64,
        output_limit_bytes=65536,
        default_timeout_s=30,
        cpu_time_s=30,
    )

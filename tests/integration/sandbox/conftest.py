"""Sandbox fixtures: a config with small limits per test, its workspaces in a directory of the test's own.

Under a root driver every sandbox runs as its own unprivileged uid, which must reach its workspace: the directory
is made in the system temp dir and traversable by others (pytest's own tmp_path is private to its user).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
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
def scratch() -> Iterator[Path]:
    """A directory of this test's own that sandboxes running as other uids can traverse (removed after)."""
    path = Path(tempfile.mkdtemp(prefix="gyre-test-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def cfg(scratch: Path, bwrap_available: None) -> SandboxConfig:
    """Limits small enough to hit quickly; workspaces under this test's own directory."""
    root = scratch / "sandboxes"
    root.mkdir()
    return SandboxConfig(
        workspace_root=str(root),
        memory_mib=256,
        max_processes=64,
        output_limit_bytes=65536,
        default_timeout_s=30,
        cpu_time_s=30,
    )

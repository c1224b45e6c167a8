"""Sandbox fixtures: a config with small limits per test, its workspaces in a directory of the test's own.

That directory is in the system temp dir, traversable by others, as workspaces are by default; under pytest's own
tmp_path (private to its user) a root driver's sandboxes reach them through bind mounts of the launcher
(`test_paths_behind_private_directories_are_still_bound`).
"""

from __future__ import annotations

import subprocess
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
    subprocess.run(["rm", "-rf", "--", str(path)], check=True)  # any depth (shutil.rmtree recurses)


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

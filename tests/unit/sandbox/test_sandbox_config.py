"""SandboxConfig in the run config, and check_backend's refusal when bubblewrap cannot run."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gyre import sandbox
from gyre.config import GyreConfig, SandboxConfig, dump_config, load_config
from gyre.errors import ConfigError, SandboxError


@pytest.fixture
def fresh_probe() -> Iterator[None]:
    """Forget the cached bwrap probe before and after the test."""
    sandbox._probe_bwrap.cache_clear()
    yield
    sandbox._probe_bwrap.cache_clear()


def test_defaults_are_isolated_and_offline() -> None:
    cfg = GyreConfig().sandbox
    assert cfg.backend == "bubblewrap" and cfg.network is False and cfg.containment == "auto"
    assert cfg.output_limit_bytes > 0 and cfg.default_timeout_s > 0


def test_sandbox_section_loads_from_toml_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[sandbox]\nbackend = "local"\nmemory_mib = 512\n')
    cfg = load_config(path, ["sandbox.max_processes=32", "sandbox.default_timeout_s=2.5"]).sandbox
    assert (cfg.backend, cfg.memory_mib, cfg.max_processes, cfg.default_timeout_s) == ("local", 512, 32, 2.5)
    assert load_config(None, []).sandbox == SandboxConfig()
    assert "[sandbox]" in dump_config(load_config(path))


@pytest.mark.parametrize(
    "override",
    ["sandbox.backend=docker", "sandbox.memory_mib=0", "sandbox.timeout=3", "sandbox.containment=none"],
)
def test_bad_values_name_the_field(override: str) -> None:
    with pytest.raises(ConfigError, match="sandbox"):
        load_config(None, [override])


def test_missing_bwrap_is_refused_with_how_to_fix(monkeypatch: pytest.MonkeyPatch, fresh_probe: None) -> None:
    real_tool = sandbox.limits.tool

    def tool(name: str) -> str:
        if name == "bwrap":
            raise SandboxError("bwrap is not installed")
        return real_tool(name)

    monkeypatch.setattr(sandbox.limits, "tool", tool)
    with pytest.raises(SandboxError, match=r"apt-get install bubblewrap.*backend = \"local\""):
        sandbox.check_backend(SandboxConfig())
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        sandbox.make_sandbox(SandboxConfig())
    assert "NOT isolated" in sandbox.check_backend(SandboxConfig(backend="local"))


def test_bwrap_that_cannot_make_namespaces_is_refused(
    monkeypatch: pytest.MonkeyPatch, fresh_probe: None
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # reachable by the unprivileged uid a root driver's probe runs as
        fake = Path(tmp, "bwrap")
        fake.write_text(
            '#!/bin/sh\necho "bwrap: No permissions to create new namespace (uid $(id -u))" >&2\nexit 1\n'
        )
        fake.chmod(0o755)
        real_tool = sandbox.limits.tool
        monkeypatch.setattr(
            sandbox.limits, "tool", lambda name: str(fake) if name == "bwrap" else real_tool(name)
        )
        with pytest.raises(
            SandboxError, match=r"No permissions to create new namespace.*apt-get install bubblewrap"
        ) as refused:
            sandbox.check_backend(SandboxConfig())
    probed_as = int(str(refused.value).split("(uid ")[1].split(")")[0])
    assert probed_as != 0 if os.geteuid() == 0 else probed_as == os.getuid()  # as sandboxes run

"""The ``gyre`` command as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

GYRE = [sys.executable, "-m", "gyre"]


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GYRE, *args], capture_output=True, text=True, timeout=timeout)


def test_help_is_instant_and_does_not_import_torch() -> None:
    # instant because it imports no torch (seconds of start-up): what ``gyre --help`` imports is checked, not its
    # seconds, which a loaded machine stretches
    out = subprocess.run([sys.executable, "-X", "importtime", *GYRE[1:], "--help"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0 and "serve-engine" in out.stdout and "init-model" in out.stdout
    imported = {
        line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")
    }
    assert "gyre.cli" in imported, out.stderr[-2000:]  # the listing is there
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")]
    code = "import sys, gyre.cli; gyre.cli.build_parser(); print('torch' in sys.modules)"
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "False"


@pytest.mark.slow(
    reason="gyre serve-engine and generate from the shell (17 s); fast-tier engines start the same way"
)
def test_init_model_then_generate_against_a_served_engine(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    out = _run("init-model", "--preset", "tiny", str(model))
    assert out.returncode == 0, out.stderr
    assert "parameters" in out.stdout and (model / "model.safetensors").exists()
    again = _run("init-model", str(model))
    assert again.returncode == 2 and "not empty" in again.stderr and "Traceback" not in again.stderr
    gen = _run(
        "generate", "--model", str(model), "--prompt", "hello", "--max-new-tokens", "8", "--temperature", "0"
    )
    assert gen.returncode == 0, gen.stderr
    assert "output: " in gen.stdout and "weight version 0" in gen.stdout


def test_bad_config_is_one_clear_line(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text("[engine]\nkv_cache_mem_gib = 'lots'\n")
    out = _run("serve-engine", "--model", str(tmp_path), "--config", str(cfg))
    assert out.returncode == 2
    assert "kv_cache_mem_gib" in out.stderr and "Traceback" not in out.stderr
    missing = _run("serve-engine", "--model", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "config.json" in missing.stderr

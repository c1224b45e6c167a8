"""``benchmarks/fuzz_families.py`` runs as a program and meets its targets at a small size: hostile replies in three
families' formats and hostile requests to their routers get no 5xx, every call the model was sent is recorded
token-exactly, and every continuation chains."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow(
    reason="three routers, each in front of a scripted model; 600 hostile requests and chained conversations (~30 s)"
)
def test_family_fuzz_has_no_5xx_and_loses_or_mischains_no_record(tmp_path: Path) -> None:
    out = tmp_path / "fuzz.json"
    program = ROOT / "benchmarks" / "fuzz_families.py"
    command = [sys.executable, str(program), "--requests", "600", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    part = json.loads(out.read_text())
    assert part["server_errors"] == 0, part["server_error_examples"]  # no 5xx, none unanswered
    assert set(part["families"]) == {"qwen3", "gpt-oss", "glm45"}
    for name, family in part["families"].items():
        statuses, chains = family["statuses"], family["chains"]
        assert family["alive"], name
        # the fuzz reached the model and the refusals alike
        assert statuses.get("2xx", 0) >= 40 and statuses.get("4xx", 0) >= 40, (name, statuses)
        assert family["lost"] == 0 and family["phantom"] == 0, (name, family)
        assert family["records"] == family["engine_calls"] >= 100, (name, family)
        assert chains["chained"] >= 8, (name, chains)  # the conversations went on, on every face
        assert chains.get("mis-chained", 0) == chains.get("broken", 0) == chains["lost"] == 0, (
            name,
            chains,
            family["chain_examples"],
        )
        assert family["refused_echoes"] == 0, (name, family["refused_examples"])
    assert "Model families" in done.stdout

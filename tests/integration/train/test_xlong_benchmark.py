"""``benchmarks/xlong.py --quick`` runs as a program and its figures meet the issue's targets at the quick sizes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow(reason="builds a tiny model and runs the xLong benchmark's quick parts (~15 s)")
def test_xlong_quick_parts_a_and_d(tmp_path: Path) -> None:
    out = tmp_path / "xlong.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "xlong.py"), "--quick", "--parts", "a,d", "--json", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    a = figures["a"]
    assert a["tokens"] == 70_000 and a["micro_steps"] >= 1
    assert a["peak_mb"] < 1024 and a["total_s"] < 30
    assert [s["stage"] for s in a["stages"]][-1].startswith("micro-steps")
    assert set(figures["d"]["per_call_ms"]) == {"7000", "70000"}
    assert "(d) router render + tokenize" in done.stdout

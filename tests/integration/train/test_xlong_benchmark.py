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
    assert (
        a["peak_mb"] < 1024
    )  # its seconds are a figure of the benchmark's, not a bound: load stretches them
    assert [s["stage"] for s in a["stages"]][-1].startswith("micro-steps")
    assert set(figures["d"]["per_call_ms"]) == {"7000", "70000"}
    assert "(d) router render + tokenize" in done.stdout


@pytest.mark.slow(
    reason="trains the micro preset on 4 + 1 rank processes and the tiny one on 1 + 2, 2 sizes (~3 min)"
)
def test_xlong_quick_parts_b_c_e(tmp_path: Path) -> None:
    out = tmp_path / "xlong.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "xlong.py"), "--quick", "--parts", "b,c,e", "--json", str(out)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    b = figures["b"]
    four, one = b["runs"][f"cp4-{b['tokens']}"], b["runs"][f"cp1-{b['tokens']}"]
    assert (
        abs(four["loss"] - one["loss"]) <= 1e-4 * abs(one["loss"]) + 1e-6
    )  # 4 ranks' parts sum to the whole
    assert set(four["stages"]) == {"forward+backward", "all-reduce", "optimizer"}
    assert b["cp4_peak_mb"] > 0 and b["ratio"] == b["cp4_peak_mb"] / b["cp1_peak_mb"]
    c = figures["c"]
    assert set(c["measured"]) == {"1", "2"} and set(c["measured"]["1"]) == {"1024", "2048"}
    for cp in ("1", "2"):
        assert c["fits"][cp]["time_s"]["projected"] > c["measured"][cp]["2048"]["seconds"]
    grouped = c["grouped"]["rows"]
    assert set(grouped) == {"tiny (2 q heads a k/v)", "tiny, 4 q heads a k/v"}
    for row in grouped.values():  # the ranks share the micro-step: each holds less than one rank alone
        assert row["peak_mb"]["2"] < row["peak_mb"]["1"] and row["kv_mb"]["2"] < row["kv_mb"]["1"]
    assert c["ratio"] == grouped["tiny (2 q heads a k/v)"]["ratio"]
    projections = {(r["model"], r["tokens"]): r for r in figures["e"]["projections"]}
    assert projections["Qwen3-8B", 700_000]["fits_cp8"] and not projections["Qwen3-32B", 700_000]["fits_cp8"]
    fits = {(r["sharding"], r["checkpointing"]): r["fits"] for r in figures["e"]["rows"]}
    assert fits == {
        ("FSDP", True): True,
        ("FSDP", False): False,
        ("ZeRO-1", True): False,
        ("ZeRO-1", False): False,
    }
    assert (
        "(b) one training step" in done.stdout
        and "CP=4 / CP=1" in done.stdout
        and "(e) Qwen3-8B" in done.stdout
    )

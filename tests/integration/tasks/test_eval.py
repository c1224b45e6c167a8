"""`gyre eval` end to end: on the embedded tiny model from the command line, and on an outside OpenAI-compatible
model (here a real `gyre router` process in front of the toy suite's scripted expert)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fakes import ScriptedEngine
from gyre.evaluation import EvalOptions, run_eval
from gyre.journal import read_journal
from gyre.models import load_tokenizer
from gyre.records import ApiCallRecord
from gyre.router.launch import launch_router
from gyre.tasks import toy


@pytest.mark.slow
def test_gyre_eval_on_the_embedded_tiny_model(tmp_path: Path, tiny_model: Path) -> None:
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "gyre", "eval", "--suite", "toy:3", "--model-path", str(tiny_model),
            "--max-steps", "2", "--run-dir", str(run), "--no-progress"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "mean" in out.stdout and str(run) in out.stdout.replace("\n", "")
    results = json.loads((run / "results.json").read_text())
    assert results["executions"] == 3 and results["model"] == "tiny"
    assert all(r["outcome"] == "scored" and 1 <= r["calls"] <= 2 for r in results["rows"])
    assert (
        run / "journal" / "calls.jsonl"
    ).stat().st_size > 0  # every call of the untrained model, token-exact


def test_gyre_eval_rejects_bad_options(tmp_path: Path) -> None:
    for args, message in (
        (["--suite", "no-such-suite"], "neither a built-in suite"),
        (["--suite", "toy:zero"], "toy:COUNT"),
        (["--suite", "toy:2", "--agent", "robot"], "expected builtin, oracle or command"),
        (["--suite", "toy:2", "--concurrency", "0"], "concurrency"),
    ):
        argv = [
            sys.executable,
            "-m",
            "gyre",
            "eval",
            *args,
            "--run-dir",
            str(tmp_path / "r"),
            "--no-progress",
        ]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_gyre_eval_on_an_outside_openai_compatible_model(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = load_tokenizer(tiny_model)
    with ScriptedEngine(tokenizer, lambda ids: toy.expert_reply(str(tokenizer.decode(ids)))) as engine:
        proc, admin = launch_router(tiny_model, [engine.url], log_path=tmp_path / "router.log")
        with proc:
            session = httpx.post(admin + "/admin/sessions", json={"execution_id": "outside"}).json()
            monkeypatch.setenv("OUTSIDE_KEY", session["token"])
            options = EvalOptions(
                suite="toy:4", run_dir=str(tmp_path / "run"), base_url=session["base_url"],
                api_key_env="OUTSIDE_KEY", model_name="tiny", progress=False,
            )  # fmt: skip
            summary = run_eval(options)
    assert summary.mean_score == 1.0 and summary.executions == 4
    lengths = {t.id: int(t.metadata["chain_length"]) for t in toy.toy_suite(4)}
    assert all(r.calls == lengths[r.task_id] + 2 and r.prompt_tokens > 0 for r in summary.rows)
    calls = list(read_journal(tmp_path / "run" / "journal" / "api_calls.jsonl", ApiCallRecord))
    assert len(calls) == sum(r.calls for r in summary.rows)
    assert all(c.request["messages"] and c.response["choices"] for c in calls)

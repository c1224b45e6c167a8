"""`gyre eval` end to end: on the embedded tiny model from the command line, on an outside OpenAI-compatible
model (here a real `gyre router` process in front of the toy suite's scripted expert), and what it says and how it
exits when a run is not clean (a dropped execution, a broken reference solution)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import msgspec
import pytest

from fakes import ScriptedEngine
from gyre.cli import EXIT_NOT_CLEAN, main
from gyre.driver.evaluation import EvalOptions, run_eval
from gyre.engine.models import load_tokenizer
from gyre.journal import read_journal
from gyre.journal.records import ApiCallRecord
from gyre.router.spawn import launch_router
from gyre.tasks import toy


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


@pytest.mark.slow(
    reason="three evaluations compared token by token (39 s); the fast tier runs gyre eval once"
)
def test_two_evaluations_with_one_seed_sample_the_same_tokens_and_another_seed_does_not(
    tmp_path: Path, tiny_model: Path
) -> None:
    """What makes the quickstart's phases comparable pairwise: with ``--seed`` each call of each execution draws
    the same random numbers, so the same weights give the same outputs, token for token."""

    def outputs(name: str, seed: str) -> list[list[int]]:
        run = tmp_path / name
        argv = [sys.executable, "-m", "gyre", "eval", "--suite", "toy:3", "--model-path", str(tiny_model),
                "--max-steps", "2", "--max-tokens-per-call", "24", "--temperature", "1.0", "--seed", seed,
                "--concurrency", "3", "--run-dir", str(run), "--no-progress"]  # fmt: skip
        out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        calls = [json.loads(line) for line in (run / "journal" / "calls.jsonl").read_text().splitlines()]
        return sorted(c["output_ids"] for c in calls)

    first = outputs("a", "7")
    assert len(first) == 6 and outputs("b", "7") == first
    assert outputs("c", "8") != first


def test_gyre_eval_rejects_bad_options(tmp_path: Path) -> None:
    for args, message in (
        (["--suite", "no-such-suite"], "neither a built-in suite"),
        (["--suite", "toy:zero"], "toy:COUNT"),
        (["--suite", "toy:2", "--agent", "robot"], "expected builtin, oracle, command:ARGV or python"),
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


@pytest.mark.slow(reason="a second served model; the fast tier evaluates the embedded one")
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


CHECK_42 = 'grep -qx 42 answer.txt || { echo "answer.txt holds $(cat answer.txt), expected 42"; exit 1; }'


def gyre_task(suite: Path, task_id: str, answer: str, verifier: str) -> None:
    """A one-file Gyre task whose reference solution writes ``answer`` to answer.txt."""
    root = suite / task_id
    (root / "solution").mkdir(parents=True)
    (root / "task.toml").write_text(f'id = "{task_id}"\ntime_budget_s = 60\n\n[verifier]\n{verifier}')
    (root / "instruction.md").write_text("Write 42 to answer.txt.\n")
    (root / "solution" / "answer.txt").write_text(answer + "\n")


def eval_oracle(
    suite: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, str, dict[str, object]]:
    """`gyre eval --agent oracle` on ``suite``: the exit status, what it printed and results.json."""
    run = suite.parent / "run"
    code = main(["eval", "--suite", str(suite), "--agent", "oracle", "--model-path", str(tiny_model),
                 "--run-dir", str(run), "--no-progress", *extra])  # fmt: skip
    out = capsys.readouterr().out
    return code, out, json.loads((run / "results.json").read_text())


@pytest.fixture
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # rich wraps at the terminal's width: keep each line whole


@pytest.mark.usefixtures("wide_terminal")
def test_a_reference_solution_scoring_below_1_fails_the_oracle_run_and_is_named(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = tmp_path / "suite"
    gyre_task(suite, "right", "42", f"commands = [{json.dumps(CHECK_42)}]")
    gyre_task(suite, "broken", "41", f"commands = [{json.dumps(CHECK_42)}]")
    code, out, results = eval_oracle(suite, tiny_model, capsys)
    assert code == EXIT_NOT_CLEAN == 3
    assert "not a clean run: 1 problem(s)" in out
    assert "broken: the reference solution scored 0.000" in out and "holds 41, expected 42" in out
    assert "right:" not in out  # only the broken task is named
    assert "mean 0.500" in out and "over 2 scored of 2 executions; 0 dropped" in out
    assert results["problems"] == [p for p in results["problems"] if p.startswith("broken:")] != []


@pytest.mark.usefixtures("wide_terminal")
def test_a_dropped_execution_fails_the_run_and_the_headline_counts_it(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = tmp_path / "suite"
    gyre_task(suite, "right", "42", f"commands = [{json.dumps(CHECK_42)}]")
    no_reward = 'commands = ["echo graded"]\nresult = "reward_file"\nreport_path = "reward.txt"'
    gyre_task(suite, "no-reward", "42", no_reward)  # its verifier never writes the file: dropped
    code, out, results = eval_oracle(suite, tiny_model, capsys, "--verifier-retries", "0")
    assert code == EXIT_NOT_CLEAN
    headline = "mean 1.000 (95% CI 1.000-1.000), pass rate 100.0%, over 1 scored of 2 executions; 1 dropped"
    assert headline in out
    assert "no-reward: dropped (done), left out of the mean" in out and "no reward file at reward.txt" in out
    assert (results["executions"], results["counted"], results["dropped"], results["mean_score"]) == (
        2,
        1,
        1,
        1.0,
    )
    report = (tmp_path / "run" / "results.md").read_text()
    assert headline in report and "## Not a clean run" in report


@pytest.mark.usefixtures("wide_terminal")
def test_a_clean_oracle_run_exits_0(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = tmp_path / "suite"
    gyre_task(suite, "right", "42", f"commands = [{json.dumps(CHECK_42)}]")
    code, out, results = eval_oracle(suite, tiny_model, capsys)
    assert code == 0 and results["problems"] == []
    assert "over 1 scored of 1 executions; 0 dropped" in out and "not a clean run" not in out


@pytest.mark.usefixtures("wide_terminal")
def test_a_task_that_did_not_run_makes_the_run_not_clean(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32: `gyre eval --agent oracle` exited 0 ("clean") when a task was refused and never ran."""
    suite = tmp_path / "suite"
    gyre_task(suite, "right", "42", f"commands = [{json.dumps(CHECK_42)}]")
    outside = f'commands = [{json.dumps(CHECK_42)}]\nresult = "reward_file"\nreport_path = "/etc/reward.txt"'
    gyre_task(suite, "outside", "42", outside)  # a report outside /logs: refused before anything runs
    code, out, results = eval_oracle(suite, tiny_model, capsys)
    assert code == EXIT_NOT_CLEAN
    assert "outside: not run: task outside: verifier report /etc/reward.txt" in out
    assert "over 1 scored of 1 executions" in out and "right:" not in out
    assert [p.split(":")[0] for p in results["problems"]] == ["outside"]  # type: ignore[union-attr]


def test_the_summary_table_is_never_cut_on_a_narrow_console(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a terminal rich drew 80 columns, and the table's twelve columns were cut: a pipe or a log file gets
    the whole table, one line a row, whatever COLUMNS says."""
    from gyre.driver.evaluation import EvalSummary, print_summary

    suite = tmp_path / "suite"
    gyre_task(suite, "right", "42", f"commands = [{json.dumps(CHECK_42)}]")
    code, _, _ = eval_oracle(suite, tiny_model, capsys)
    assert code == 0
    summary = msgspec.json.decode((tmp_path / "run" / "results.json").read_bytes(), type=EvalSummary)
    for width in ("80", "40"):
        monkeypatch.setenv("COLUMNS", width)
        print_summary(summary, str(tmp_path / "run"))
        out = capsys.readouterr().out
        assert "…" not in out and "wall time" in out and "placeholders" in out and "mean tokens" in out, out


def test_the_default_model_is_never_created_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32: without --model-path, `gyre eval` created models/tiny in the working directory without a word."""
    from gyre.driver.evaluation import _ensure_model

    monkeypatch.chdir(tmp_path)
    _ensure_model("models/tiny")
    err = capsys.readouterr().err
    assert (tmp_path / "models" / "tiny" / "config.json").is_file()
    assert "created the tiny model" in err and str(tmp_path / "models" / "tiny") in err
    _ensure_model("models/tiny")  # there now: nothing said
    assert capsys.readouterr().err == ""

"""The built-in suites, verified for real: reference solutions score 1, empty workspaces 0, half-finished ones between;
the toy suite's scripted expert solves it through the real router, runtime and sandboxes."""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fakes import ScriptedEngine
from gyre.config import RouterConfig, SandboxConfig
from gyre.driver.evaluation import EvalOptions, run_eval
from gyre.engine.models import load_tokenizer
from gyre.journal import read_journal
from gyre.journal.records import CallRecord
from gyre.router.routing import Router
from gyre.runtime import ExecutionResult, ExecutionSpec, OracleAgentSpec, Runtime
from gyre.tasks import Task, Verdict, Verifier, resolve_suite, toy
from gyre.tasks.catalog import SUITES_DIR

MINI = SUITES_DIR / "nl2repo-mini"


def test_nl2repo_mini_is_a_real_suite() -> None:
    tasks = resolve_suite("nl2repo-mini")
    assert len(tasks) >= 10
    for task in tasks:
        assert task.format == "nl2repo" and task.unsupported is None
        assert task.verifier is not None and (task.verifier.declared_test_count or 0) >= 15
        assert len([p for p in task.hidden_files if p.startswith("tests/test_")]) >= 2
        modules = {p.split("/")[1] for p in task.solution_files if p.endswith(".py")}
        assert len(modules - {"__init__.py"}) >= 2, f"{task.id}: a library of several modules"
        assert len(task.instruction) > 2000, f"{task.id}: the spec must carry the behaviours the tests check"
        assert not any(p.startswith(("tests/", "solution/")) for p in task.solution_files)


@pytest.mark.slow(
    reason="grades nl2repo-mini's reference, empty and half-finished workspaces with real verifier runs"
)
def test_nl2repo_mini_solution_scores_1_empty_0_half_finished_between(tmp_path: Path) -> None:
    tasks = resolve_suite("nl2repo-mini")

    def tree(root: Path, files: dict[str, str]) -> Path:
        root.mkdir(parents=True)
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        return root

    async def all_verdicts() -> list[tuple[str, str, Verdict]]:
        verifier = Verifier(SandboxConfig())
        jobs = []
        for task in tasks:
            partial_dir = MINI / task.id / "partial"
            partial = {
                p.relative_to(partial_dir).as_posix(): p.read_text() for p in partial_dir.rglob("*.py")
            }
            for kind, files in (("solution", task.solution_files), ("empty", {}), ("partial", partial)):
                ws = tree(tmp_path / task.id / kind, files)
                jobs.append((task.id, kind, verifier.verify(task, ws)))
        verdicts = await asyncio.gather(*(job for _, _, job in jobs))
        return [(t, k, v) for (t, k, _), v in zip(jobs, verdicts, strict=True)]

    for task_id, kind, verdict in asyncio.run(all_verdicts()):
        assert verdict.outcome == "scored", (task_id, kind, verdict.detail)
        if kind == "solution":
            assert verdict.score == 1.0 and verdict.passed == verdict.declared, (task_id, verdict.detail)
        elif kind == "empty":
            assert verdict.score == 0.0, task_id
        else:
            assert 0.0 < verdict.score < 1.0, (task_id, verdict.score)


def test_toy_horizons_are_heavy_tailed_and_tasks_reproducible() -> None:
    lengths = [int(t.metadata["chain_length"]) for t in toy.toy_suite(2000, seed=3)]
    assert statistics.median(lengths) <= 3  # most are short
    assert max(lengths) >= 18 and sum(n >= 10 for n in lengths) >= 40  # a few are very long
    assert toy.toy_suite(5, seed=1) == toy.toy_suite(5, seed=1)
    assert toy.toy_suite(5, seed=1) != toy.toy_suite(5, seed=2)


def test_toy_partial_credit_moves_with_each_correct_step(tmp_path: Path) -> None:
    task = toy.make_task(0, length=4)
    chain = task.hidden_files["tests/expected.txt"].split()  # 4 names, then "end"

    async def score(trail: str | None) -> float:
        ws = tmp_path / f"ws{time.monotonic_ns()}"
        ws.mkdir()
        for rel, text in task.files.items():
            (ws / rel).write_text(text)
        if trail is not None:
            (ws / "trail").write_text(trail)
        verdict = await Verifier().verify(task, ws)
        assert verdict.outcome == "scored", verdict.detail
        return verdict.score

    async def scores() -> list[float]:
        trails = [None, *["\n".join(chain[:k]) + "\n" for k in range(1, 6)], "wrong\n" + "\n".join(chain)]
        return list(await asyncio.gather(*(score(t) for t in trails)))

    assert asyncio.run(scores()) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 0.0]


def test_toy_expert_follows_the_chain() -> None:
    start = toy.expert_reply("<|im_start|>user\nFollow the chain<|im_end|>\n<|im_start|>assistant\n")
    assert '"cat start | tee -a trail"' in start
    shown = (
        "<|im_start|>user\n<tool_response>\nexit code: 0\nstdout:\n417\n\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert '"cat 417 | tee -a trail"' in toy.expert_reply(shown)
    assert '"submit"' in toy.expert_reply(shown.replace("417", "end"))


def test_the_impatient_expert_gives_up_at_about_one_name_in_five_and_always_alike() -> None:
    def shown(name: str, before: str) -> str:
        return (f"<|im_start|>user\n{before}<tool_response>\nexit code: 0\nstdout:\n{name}\n\n</tool_response>"
                "<|im_end|>\n<|im_start|>assistant\n")  # fmt: skip

    start = "<|im_start|>user\nFollow the chain<|im_end|>\n<|im_start|>assistant\n"
    assert toy.impatient_reply(start) == toy.expert_reply(start)  # the first call is never given up
    assert '"submit"' in toy.impatient_reply(shown("end", ""))
    prompts = [shown(f"{a}{b}{c}", f"task {k}") for k, (a, b, c) in enumerate(zip("123456789" * 40, "987654321" * 40,
                                                                                 "192837465" * 40, strict=True))]  # fmt: skip
    replies = [toy.impatient_reply(p) for p in prompts]
    gave_up = sum('"submit"' in r for r in replies) / len(replies)
    assert 0.13 < gave_up < 0.27  # GIVE_UP = 0.2
    assert replies == [toy.impatient_reply(p) for p in prompts]  # the same conversation, the same choice
    assert all('"submit"' in r or r == toy.expert_reply(p) for p, r in zip(prompts, replies, strict=True))


def eval_options(tmp_path: Path, tiny_model: Path, suite: str, **kw: Any) -> EvalOptions:
    return EvalOptions(
        suite=suite, run_dir=str(tmp_path / "run"), model_path=str(tiny_model), progress=False, **kw
    )


@pytest.mark.slow(reason="a whole oracle eval of the toy suite through sandboxes and the router")
def test_eval_oracle_runs_the_toy_expert_through_the_real_pipeline(tmp_path: Path, tiny_model: Path) -> None:
    summary = run_eval(eval_options(tmp_path, tiny_model, "toy:12", agent="oracle", concurrency=6))
    assert summary.executions == 12 and summary.outcomes == {"scored": 12}
    assert summary.mean_score == 1.0 and summary.pass_rate == 1.0
    lengths = {t.id: int(t.metadata["chain_length"]) for t in toy.toy_suite(12)}
    for row in summary.rows:  # one bash call per file of the chain and `start`, then submit
        assert row.calls == lengths[row.task_id] + 2, row
    run = tmp_path / "run"
    assert {"results.json", "results.md", "scores.png", "options.json"} <= {p.name for p in run.iterdir()}
    assert json.loads((run / "results.json").read_text())["mean_score"] == 1.0
    assert "| toy-0-0000 |" in (run / "results.md").read_text()
    calls = list(read_journal(run / "journal" / "calls.jsonl", CallRecord))
    executions = [
        json.loads(line) for line in (run / "journal" / "executions.jsonl").read_text().splitlines()
    ]
    assert len(calls) == sum(r.calls for r in summary.rows)  # the journal holds every call: demonstrations
    assert {c.source for c in calls} == {"scripted"}  # marked as such: their logprobs are made up
    assert all(e["verdict"]["outcome"] == "scored" and e["reward"] == 1.0 for e in executions)


@pytest.mark.slow(reason="a whole oracle eval with the lean agent profile")
def test_the_lean_profile_prompts_with_two_tools_and_the_expert_still_solves_the_chain(
    tmp_path: Path, tiny_model: Path
) -> None:
    from gyre.engine.models import load_tokenizer
    from gyre.journal.records import expand_inputs

    lean = run_eval(eval_options(tmp_path, tiny_model, "toy:4", agent="oracle", agent_profile="lean"))
    assert lean.mean_score == 1.0 and lean.pass_rate == 1.0
    calls = list(read_journal(tmp_path / "run" / "journal" / "calls.jsonl", CallRecord))
    first = load_tokenizer(tiny_model).decode(expand_inputs(calls)[calls[0].call_id])
    assert '"name": "bash"' in first and '"name": "submit"' in first and '"name": "read_file"' not in first
    assert "Use the tools. Call `submit` when done." in first and "software engineer" not in first
    default = run_eval(eval_options(tmp_path / "default", tiny_model, "toy:4", agent="oracle"))
    assert lean.mean_tokens < 0.6 * default.mean_tokens  # the prompt the tiny model attends over is shorter


@pytest.mark.slow(reason="a whole oracle eval of nl2repo-mini, each task graded by pytest in a sandbox")
def test_eval_oracle_validates_nl2repo_mini(tmp_path: Path, tiny_model: Path) -> None:
    summary = run_eval(eval_options(tmp_path, tiny_model, "nl2repo-mini", agent="oracle", concurrency=4))
    assert summary.executions >= 10
    assert [r.task_id for r in summary.rows if r.score != 1.0] == []
    assert all(r.passed == r.declared and r.calls == 0 for r in summary.rows)


def test_a_broken_task_shows_up_as_an_oracle_score_below_1(tmp_path: Path, tiny_model: Path) -> None:
    suite = tmp_path / "suite"
    shutil.copytree(MINI / "number-words", suite / "number-words")
    roman = suite / "number-words" / "solution" / "numwords" / "roman.py"
    roman.write_text(roman.read_text().replace('"M"', '"Q"'))  # a wrong reference solution
    summary = run_eval(eval_options(tmp_path, tiny_model, str(suite), agent="oracle"))
    assert 0.0 < summary.rows[0].score < 1.0


def run_runtime(tiny_model: Path, engine_url: str, specs: list[ExecutionSpec]) -> list[ExecutionResult]:
    async def go() -> list[ExecutionResult]:
        router = Router(RouterConfig(model_path=str(tiny_model), engines=[engine_url]))
        runtime = Runtime(router, SandboxConfig())
        try:
            return await runtime.run(specs)
        finally:
            await runtime.aclose()
            await router.aclose()

    return asyncio.run(go())


def slow_expert(tokenizer: Any, delay_s: float) -> Any:
    def script(ids: list[int]) -> str:
        time.sleep(delay_s)
        return toy.expert_reply(str(tokenizer.decode(ids)))

    return script


@pytest.mark.slow(reason="runs executions out to their time budgets")
def test_executions_out_of_time_or_crashed_are_scored_from_their_artifacts(tiny_model: Path) -> None:
    tokenizer = load_tokenizer(tiny_model)
    long_task = toy.make_task(1, length=20)
    long_task = msgspec.structs.replace(long_task, time_budget_s=3.0)
    crashing = toy.make_task(
        2, length=3
    )  # the oracle agent crashes on it: the toy suite has no solution files
    bad_setup = Task(id="bad", instruction="x", files={"../outside": "x"}, verifier=long_task.verifier)
    with ScriptedEngine(tokenizer, slow_expert(tokenizer, 0.2)) as engine:
        cut, crashed, unset = run_runtime(
            tiny_model,
            engine.url,
            [
                ExecutionSpec(task=long_task),
                ExecutionSpec(task=crashing, agent=OracleAgentSpec()),
                ExecutionSpec(task=bad_setup),
            ],
        )
    assert cut.status == "budget_exceeded" and cut.verdict is not None and cut.verdict.outcome == "scored"
    assert 0.0 < cut.reward < 1.0  # the steps it took before the budget ran out count
    assert crashed.status == "crashed" and "no reference solution" in (crashed.error or "")
    assert crashed.verdict is not None and crashed.verdict.outcome == "scored" and crashed.reward == 0.0
    assert unset.status == "crashed" and unset.verdict is not None
    assert (unset.verdict.outcome, unset.reward, unset.trainable) == ("placeholder", 0.0, True)


def test_unsupported_tasks_are_reported_not_run(tmp_path: Path, tiny_model: Path) -> None:
    suite = tmp_path / "suite"
    shutil.copytree(Path(__file__).parents[2] / "unit" / "tasks" / "data" / "harbor-image", suite / "image")
    shutil.copytree(Path(__file__).parents[2] / "unit" / "tasks" / "data" / "harbor-hello", suite / "hello")
    (suite / "hello" / "solution").mkdir()
    (suite / "hello" / "solution" / "solve.sh").write_text("echo hello > hello.txt\n")
    summary = run_eval(eval_options(tmp_path, tiny_model, str(suite), agent="oracle"))
    assert [r.task_id for r in summary.rows] == ["hello"] and summary.rows[0].score == 1.0
    assert "container image" in summary.unsupported["image"]

"""The ``long`` suite: full-size tasks need hundreds of calls over 100K+ tokens by construction, a scaled-down one is
scored with partial credit from its trail, and its ``ci`` script and scripted expert walk the pipeline."""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path

import pytest

from gyre.agents.toolagent import CONTEXT_BUDGET_KEY, IDLE_COMMAND_KEY
from gyre.engine.models import load_tokenizer
from gyre.errors import TaskError
from gyre.tasks import Verifier, long, resolve_suite


def test_full_size_tasks_take_hundreds_of_calls_of_hundreds_of_tokens_each(tiny_model: Path) -> None:
    tokenizer = load_tokenizer(tiny_model)  # every preset's tokenizer (micro's too)
    for task in resolve_suite("long"):
        order = task.hidden_files["tests/expected.txt"].split()
        assert 200 <= len(order) - 1 <= 300 and len(order) == len(set(order))
        assert task.limits.max_turns is not None and task.limits.max_turns > len(
            order
        )  # the agent may finish
        # the logs the pipeline shows: each 500-700 tokens, naming the next stage once, the last one the end
        logs = [str(task.files[f"logs/{stage}"]) for stage in order]
        sizes = [len(tokenizer.encode(text)) for text in logs]
        assert min(sizes) >= 500 and max(sizes) <= 700, (min(sizes), max(sizes))
        assert sum(sizes) >= 100_000
        for text, following in zip(logs, order[1:], strict=False):
            assert re.findall(r"^next stage: (\d+)$", text, re.M) == [following]
        assert long.DONE in logs[-1] and "next stage" not in logs[-1]
        # a policy that never calls a tool sees a log per call, and the context is never compacted
        assert task.metadata[CONTEXT_BUDGET_KEY] == "0" and task.metadata[IDLE_COMMAND_KEY]
    assert resolve_suite("long:3:5") == resolve_suite("long:3:5") != resolve_suite("long:3:6")


def test_suite_specs_scale_the_pipeline_and_bad_ones_say_what_is_expected() -> None:
    tasks = resolve_suite("long:2:1:5")
    assert [len(t.hidden_files["tests/expected.txt"].split()) for t in tasks] == [6, 6]
    assert [t.limits.max_turns for t in tasks] == [16, 16]
    for spec in ("long:x", "long:0", "long:1:0:-1"):
        with pytest.raises(TaskError, match="long"):
            resolve_suite(spec)


def test_ci_records_each_stage_run_and_the_score_is_the_share_run_in_order(tmp_path: Path) -> None:
    task = long.make_task(0, stages=4)
    order = task.hidden_files["tests/expected.txt"].split()  # start, then 4 stages

    def workspace(name: str) -> Path:
        ws = tmp_path / name
        for rel, text in task.files.items():
            (ws / rel).parent.mkdir(parents=True, exist_ok=True)
            (ws / rel).write_text(str(text))
        return ws

    def ci(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "ci", *args], cwd=ws, capture_output=True, text=True, check=False)

    ws = workspace("walked")
    shown = ci(ws, "start")
    assert shown.returncode == 0 and f"next stage: {order[1]}" in shown.stdout
    assert ci(ws, "nope").returncode != 0 and ci(ws, "../ci").returncode != 0  # recorded nothing
    idle = subprocess.run(
        ["sh", "-c", long.IDLE_COMMAND], cwd=ws, capture_output=True, text=True, check=False
    )
    assert idle.stdout == shown.stdout  # the last stage's log again, recorded nothing
    ci(ws, order[1])
    assert (ws / "trail").read_text().split() == order[:2]

    async def score(trail: str | None) -> float:
        ws = workspace(f"scored-{len(trail or '')}-{hash(trail)}")
        if trail is not None:
            (ws / "trail").write_text(trail)
        verdict = await Verifier().verify(task, ws)
        assert verdict.outcome == "scored", verdict.detail
        return verdict.score

    async def scores() -> list[float]:
        trails = [None, *["\n".join(order[:k]) + "\n" for k in range(1, 6)], "\n".join(order[1:]) + "\n"]
        return list(await asyncio.gather(*(score(t) for t in trails)))

    assert asyncio.run(scores()) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 0.0]


def test_the_expert_runs_the_stage_each_log_names_and_submits_at_the_end() -> None:
    def after(log: str) -> str:
        return long.expert_reply(
            f"<|im_start|>user\n<tool_response>\nexit code: 0\nstdout:\n{log}\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n"
        )

    task = long.make_task(0, stages=3)
    order = task.hidden_files["tests/expected.txt"].split()
    assert '"sh ci start"' in long.expert_reply("<|im_start|>user\nRun it<|im_end|>\n<|im_start|>assistant\n")
    assert f'"sh ci {order[1]}"' in after(str(task.files["logs/start"]))
    assert '"submit"' in after(str(task.files[f"logs/{order[-1]}"]))

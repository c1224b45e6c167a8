"""The xLong effect (issue 55): a long agent execution on Qwen3's template folds into one path of the prefix tree.

Fifty calls through the router, each reply a ``<think>`` block, a sentence and one tool call (Qwen3's exact output),
each tool result a few hundred characters, a new user message every ten calls. Qwen3's template drops the reasoning
of turns before the last user message, so its own render of the history changes at every user message: continuing
from the ids the model produced, the execution is one chain, which the trainer's step builder (default Jmax) trains
whole at the cost of its own length. Rendering such calls anew (``router.continuation = "canonical"``) branches there.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes import ScriptedEngine
from gyre.config import RouterConfig, TrajectoryConfig
from gyre.journal.records import CallRecord
from gyre.router.openai_types import ChatRequest
from gyre.router.render import ChatRenderer
from gyre.router.routing import Router
from gyre.train.step import Rollout, build_step_from_config
from model_families import FAMILIES, family_tokenizer, reply_text

ROOT = Path(__file__).resolve().parents[3]
CALLS, USER_EVERY = 50, 10
TOOLS: Any = [
    {"type": "function", "function": {"name": "bash", "description": "Run a command.", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
]  # fmt: skip


def _listing(i: int, rng: random.Random) -> str:
    """A tool result of about 300 characters, different on every call."""
    lines = [f"-rw-r--r-- 1 agent agent {rng.randint(10, 99999):>6} src/mod_{i}_{k}.py" for k in range(7)]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[ScriptedEngine, dict[str, int]]]:
    """Qwen3 replying to call ``state["i"]``: reasoning, a sentence, one call."""
    state = {"i": 0}

    def reply(ids: list[int]) -> str:
        i = state["i"]
        return reply_text("qwen3", reasoning=f"Step {i}: list part {i}, then look at what changed.",
                          content=f"Listing part {i}.", calls=[("bash", {"command": f"ls -la part{i}"})])  # fmt: skip

    with ScriptedEngine(family_tokenizer("qwen3"), reply, stops=FAMILIES["qwen3"].stops) as fake:
        yield fake, state


def _execution(engine: tuple[ScriptedEngine, dict[str, int]], continuation: str) -> list[CallRecord]:
    """The records of one 50-call execution; the client echoes each reply as it got it, reasoning included."""
    fake, state = engine
    router = Router(RouterConfig(engines=[fake.url], continuation=continuation),  # type: ignore[arg-type]
                    renderer=ChatRenderer(family_tokenizer("qwen3")))  # fmt: skip
    rng = random.Random(0)

    async def run() -> list[CallRecord]:
        try:
            token = router.open_session(f"long-{continuation}")
            messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                              {"role": "user", "content": "Survey the repository."}]  # fmt: skip
            for i in range(CALLS):
                state["i"] = i
                req = ChatRequest(model="", messages=list(messages), tools=TOOLS)
                message = (await router.chat(token, req))["choices"][0]["message"]
                [call] = message["tool_calls"]
                messages += [
                    message,
                    {"role": "tool", "tool_call_id": call["id"], "content": _listing(i, rng)},
                ]
                if (i + 1) % USER_EVERY == 0:
                    messages.append({"role": "user", "content": f"Good. Now part {(i + 1) // USER_EVERY}."})
            return list(router.session(token).records)
        finally:
            await router.aclose()

    return asyncio.run(run())


def _fold(records: list[CallRecord]) -> tuple[int, int, int, int]:
    """Paths the trainer selects (default Jmax), sampled tokens it trains, tokens it computes; the length."""
    rollout = Rollout(execution_id="e", group="g", reward=1.0, records=records)
    # scripted output is not the policy's: trained as a demonstration, selected and packed as the policy's is
    step = build_step_from_config([rollout], TrajectoryConfig(), objective="supervised")
    last = records[-1]
    length = last.prefix_len + len(last.new_input_ids) + len(last.output_ids)
    return step.paths["e"], step.trainable_tokens, step.computed_tokens, length


def test_a_fifty_call_qwen3_execution_with_user_turns_folds_into_one_path(
    engine: tuple[ScriptedEngine, dict[str, int]],
) -> None:
    records = _execution(engine, "exact")
    assert len(records) == CALLS
    assert [r.parent_call_id for r in records] == [None, *(r.call_id for r in records[:-1])]
    # the template's render differs at each user message (the earlier reasoning dropped), and the record says so
    diverged = [i for i, r in enumerate(records) if r.divergence is not None]
    assert diverged == list(range(USER_EVERY, CALLS, USER_EVERY))
    assert {r.divergence.kind for r in records if r.divergence is not None} == {"reasoning"}
    paths, trained, computed, length = _fold(records)
    assert paths == 1
    assert trained == sum(len(r.output_ids) for r in records)  # every sampled token
    assert computed <= 1.05 * length, (computed, length)


def test_rendering_those_calls_anew_branches_at_every_user_message(
    engine: tuple[ScriptedEngine, dict[str, int]],
) -> None:
    records = _execution(engine, "canonical")
    branches = [i for i, r in enumerate(records) if r.parent_call_id is None]
    assert branches == [0, *range(USER_EVERY, CALLS, USER_EVERY)]
    for before, after in itertools.pairwise(records):  # between user messages the calls still chain
        assert after.parent_call_id in (None, before.call_id)
    paths, _, computed, length = _fold(records)
    assert paths > 1
    assert computed > 1.5 * length, (computed, length)  # each branch computes the history again


@pytest.mark.slow(
    reason="runs benchmarks/family_chains.py --quick as a program: 20 calls on four families (~6 s)"
)
def test_the_family_chains_benchmark_runs_and_meets_its_target(tmp_path: Path) -> None:
    out = tmp_path / "family_chains.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "family_chains.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    exact, canonical = figures["qwen3"]["exact"], figures["qwen3"]["canonical"]
    assert (exact["branches"], exact["trained_share"]) == (1, 1.0)
    assert exact["computed_ratio"] <= figures["target_ratio"] < canonical["computed_ratio"]
    assert all(f["exact"]["branches"] == 1 for f in figures["families"].values())
    assert "target (exact): 1 branch, 100% trained" in done.stdout

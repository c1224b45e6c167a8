"""The ``long`` suite: CI-pipeline tasks whose executions make hundreds of calls and reach 100K+ tokens.

Each task hides a pipeline of stages, as ``toy`` hides a chain of files: ``sh ci STAGE`` prints the stage's build and
test log (``LOG_TOKENS`` bytes of realistic noise, each byte one token of Gyre's byte-level tokenizer) and records the
stage in ``trail``; one line somewhere in the log, ``next stage: NAME``, names the next stage, and the last log says
``pipeline complete``. The score is partial credit from the artifact, as in ``toy``: the share of the pipeline that
``trail`` holds in order, so an execution cut off by its time budget still earns what it did. A full-size task has
200-300 stages, so solving it takes as many calls and one context of 150K-230K tokens.

A policy that does not call tools yet (the untrained tiny or micro model) still makes the execution long: the task
asks the built-in agent (its metadata, `gyre.agents.toolagent.IDLE_COMMAND_KEY`) to answer a reply without a tool call
with the current stage's log again, and never to compact its context (`CONTEXT_BUDGET_KEY`), so each of its calls
adds a log and the execution's records are one path of all its tokens: what long-context training trains on.

Suite names: ``long`` (8 tasks), ``long:N``, ``long:N:SEED``, and ``long:N:SEED:STAGES`` with every pipeline
``STAGES`` long (a scaled-down run). To train on one execution (the micro preset attends over 1M positions)::

    gyre init-model models/micro --preset micro
    gyre train long.toml --model models/micro

with ``long.toml`` (every call adds ~800 tokens: ``agent_max_calls`` x 800 tokens of context; a path longer than
``trainer.max_tokens_per_rank`` is computed by all of the core cell's ``trainer.ranks`` ranks together)::

    [run]
    suite = "long:1"
    steps = 1
    tasks_per_step = 1
    group_size = 1
    agent_max_calls = 320      # the task's own limit (its stages + 11) binds below this
    agent_max_tokens = 16      # junk from an untrained model: the logs make the context, not the completions
    agent_profile = "lean"

    [trajectory]
    skip_zero_advantage = false  # a group of one has advantage 0: compute it anyway
    micro_step_tokens = 8192

    [trainer]
    ranks = 2
    max_tokens_per_rank = 8192

    [cells]
    count = 1

``tests/integration/cli/test_long_workload.py`` runs this scaled down (``long:1:0:16``: 27 calls, 22K tokens).
Measured on 2 busy CPU cores, ``gyre eval --suite long:1 --model-path models/micro --max-steps 400
--max-tokens-per-call 16 --agent-profile lean`` (the untrained micro model, one full-size execution: 258 calls, one
context of 208K tokens) took 12 min: a call costs ~0.25 s at 10K tokens of context, ~1.1 s at 50K, 2-3.5 s at 100K and
~5 s at 200K, growing linearly with the history (the embedded engine, one torch thread for a model this small,
prefills each call's ~800 new tokens against all of it).
"""

from __future__ import annotations

import random
import re

from gyre.tasks import toy
from gyre.tasks.task import Task, TaskLimits, VerifierSpec

STAGES = (200, 300)  # a full-size pipeline's stages, drawn uniformly
LOG_TOKENS = 600  # bytes (= tokens of the byte-level tokenizer) of one stage's log, about
ALPHABET = "123456789"
START = "start"
TRAIL = toy.TRAIL  # the grader reads it
DONE = "pipeline complete"
NEXT = "next stage: "
SPARE_CALLS = 10  # calls past the stages: a misstep or two, and the submit

INSTRUCTION = f"""Run the CI pipeline. `sh ci STAGE` prints the log of one stage and records that you ran it. \
Somewhere in each log a line `{NEXT}NAME` names the stage to run after it; the last stage's log says \
`{DONE}`. Start with `sh ci {START}`, run every stage in order, then call `submit`."""

# ci STAGE: the stage's log, and the stage appended to the trail; an unknown stage changes nothing
CI_SCRIPT = f"""\
case "$1" in ''|*/*|.*) echo "usage: sh ci STAGE" >&2; exit 2;; esac
[ -f "logs/$1" ] || {{ echo "ci: no stage named '$1'" >&2; exit 1; }}
cat "logs/$1" && echo "$1" >> {TRAIL}
"""
# what a reply without a tool call is answered with: the log of the last stage run (nothing is recorded)
IDLE_COMMAND = f'cat "logs/$(tail -n 1 {TRAIL} 2>/dev/null || echo {START})"'

# the grader is toy's: the share of the expected order that the trail holds, in order
SCORE_SCRIPT = toy.SCORE_SCRIPT

_MODULES = ("core", "io", "net", "parser", "sched", "cache", "auth", "store", "codec", "rpc", "util", "cli")
_WORDS = (
    "alloc",
    "buffer",
    "config",
    "handler",
    "index",
    "lexer",
    "pool",
    "queue",
    "reader",
    "stream",
    "table",
)
_LINES = (
    "[{pct:3d}%] Building CXX object src/{mod}/CMakeFiles/{mod}.dir/{word}.cc.o",
    "[{pct:3d}%] Linking CXX static library lib{mod}.a",
    "test_{word}_{n} ({mod}.tests.Test{Word}) ... ok",
    "test_{word}_roundtrip ({mod}.tests.Test{Word}) ... skipped 'needs network'",
    "src/{mod}/{word}.cc:{line}:{col}: warning: unused variable 'tmp{n}' [-Wunused-variable]",
    "  Downloading {word}-{major}.{minor}.{n}-py3-none-any.whl ({kb} kB)",
    "PASSED tests/{mod}/test_{word}.py::test_case_{n} [{pct:3d}%]",
    "DEBUG {mod}.{word}: cache miss for key {hexa} after {ms} ms",
    "ccache: hit rate {pct}% ({n} hits, {line} misses), {kb} kB written",
    "   Compiling {word}-{mod} v{major}.{minor}.{n}",
)


def _noise(rng: random.Random) -> str:
    template = rng.choice(_LINES)
    word = rng.choice(_WORDS)
    return template.format(pct=rng.randrange(101), mod=rng.choice(_MODULES), word=word, Word=word.title(),
                           n=rng.randrange(1, 400), line=rng.randrange(1, 900), col=rng.randrange(1, 80),
                           major=rng.randrange(4), minor=rng.randrange(30), kb=rng.randrange(8, 4000),
                           ms=rng.randrange(1, 250), hexa=f"{rng.getrandbits(32):08x}")  # fmt: skip


def stage_log(rng: random.Random, stage: str, following: str | None) -> str:
    """A stage's log of about ``LOG_TOKENS`` bytes: build and test noise with one line naming the stage after it
    (``following``; None: the last stage, whose log says the pipeline is complete) at a random place."""
    key = f"{NEXT}{following}" if following is not None else f"=== {DONE}: all stages passed ==="
    lines = [f"=== stage {stage} ==="]
    while sum(len(line) + 1 for line in lines) < LOG_TOKENS - len(key) - 1:
        lines.append(_noise(rng))
    lines.insert(rng.randrange(2, len(lines) + 1), key)
    return "\n".join(lines) + "\n"


def make_task(index: int, seed: int = 0, stages: int | None = None) -> Task:
    """Long task ``index`` of the suite with ``seed``: a pipeline of ``stages`` stages (None: drawn from ``STAGES``)."""
    from gyre.agents.toolagent import (  # here: the agents import gyre.tasks
        CONTEXT_BUDGET_KEY,
        IDLE_COMMAND_KEY,
    )

    rng = random.Random(f"gyre-long/{seed}/{index}")
    stages = stages or rng.randint(*STAGES)
    names: list[str] = []
    while len(names) < stages + 8:  # the pipeline, then decoys
        name = "".join(rng.choices(ALPHABET, k=4))
        if name not in names:
            names.append(name)
    pipeline, decoys = names[:stages], names[stages:]
    order = [START, *pipeline]
    files = {
        f"logs/{here}": stage_log(rng, here, there)
        for here, there in zip(order, [*pipeline, None], strict=True)
    }
    for decoy in decoys:
        files[f"logs/{decoy}"] = stage_log(rng, decoy, rng.choice(names))
    return Task(
        id=f"long-{seed}-{index:04d}",
        instruction=INSTRUCTION,
        files={"ci": CI_SCRIPT, **dict(sorted(files.items()))},
        time_budget_s=600.0 + 10.0 * stages,
        metadata={
            "suite": "long",
            "stages": str(stages),
            CONTEXT_BUDGET_KEY: "0",
            IDLE_COMMAND_KEY: IDLE_COMMAND,
        },
        hidden_files={"tests/expected.txt": "\n".join(order) + "\n", "tests/score.py": SCORE_SCRIPT},
        verifier=VerifierSpec(
            commands=("python3 tests/score.py",),
            result="reward_file",
            report_path="tests/reward.txt",
            timeout_s=60.0,
        ),
        limits=TaskLimits(max_turns=stages + 1 + SPARE_CALLS),
        expert="long-pipeline",
    )


def long_suite(count: int = 8, seed: int = 0, stages: int | None = None) -> list[Task]:
    """``count`` long tasks; ``stages`` fixes every pipeline's length (None: full size, 200-300)."""
    return [make_task(i, seed, stages) for i in range(count)]


_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)
_NEXT = re.compile(rf"^{NEXT}([{ALPHABET}]{{4}})$", re.M)


def expert_reply(prompt: str) -> str:
    """The scripted expert's next assistant message (Hermes tool-call markup) for a rendered ChatML ``prompt``."""
    from gyre.tasks.toy import _call

    turns = prompt.rsplit("<|im_start|>assistant", 1)[0]
    responses = _RESPONSE.findall(turns.rsplit("<|im_start|>user", 1)[-1])
    if not responses:
        return _call("bash", {"command": f"sh ci {START}"})
    if DONE in responses[-1]:
        return _call("submit", {"answer": "done"})
    if found := _NEXT.search(responses[-1]):
        return _call("bash", {"command": f"sh ci {found.group(1)}"})
    return _call("submit", {"answer": "lost the pipeline"})

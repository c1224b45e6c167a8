"""The ``toy`` suite: file-chain tasks a tiny model can learn with RL on a CPU, shaped like the real thing.

Each task hides a chain of files: ``start`` names the first file, every file names the next, the last one says
``end``. The agent follows it with one shell command per step, ``cat NAME | tee -a trail``, which shows the next name
and appends it to ``trail``, then submits. One skill solves it all (copy the name just shown into the next command),
the horizon is the chain's length (heavy-tailed: most chains are short, a few are long), and the score is partial
credit from the artifact: the share of the chain that ``trail`` holds in order, so it moves with each correct step and
an execution cut off by its time budget still earns what it did. Decoy files make guessing the order useless.

`expert_reply` is the scripted expert that solves them (`gyre eval --agent oracle`, demonstrations, tests);
`impatient_reply` is a worse one that gives up partway (``--expert toy-chain-impatient``): demonstrations a policy
can learn the skill from and then, by RL on the score, outgrow.
"""

from __future__ import annotations

import hashlib
import random
import re

from gyre.tasks.task import Task, TaskLimits, VerifierSpec

MAX_CHAIN = 24
# Names are 3 digits: characters the rest of the conversation (prompt, commands, tool results) hardly uses, so the
# tokens to copy stand out; with lowercase names the tiny model did not learn to copy them in minutes
# (BENCHMARKS.md, "Quickstart").
ALPHABET = "123456789"
END = "end"
TRAIL = "trail"
START = "start"

INSTRUCTION = f"""Follow the file chain. The file `{START}` holds the name of the first file; every file holds the \
name of the next one; the last one holds `{END}`. For each file, starting with `{START}`, run the bash command \
`cat NAME | tee -a {TRAIL}` (it prints the next name and records your step). When a file prints `{END}`, call \
`submit`."""

SCORE_SCRIPT = f"""\
import pathlib
expected = pathlib.Path("tests/expected.txt").read_text().split()
trail = pathlib.Path("{TRAIL}")
got = trail.read_text(errors="replace").split() if trail.is_file() and not trail.is_symlink() else []
n = 0
while n < min(len(got), len(expected)) and got[n] == expected[n]:
    n += 1
pathlib.Path("tests/reward.txt").write_text(str(n / len(expected)))
"""


def chain_length(rng: random.Random, alpha: float = 1.6) -> int:
    """A heavy-tailed length in 1..MAX_CHAIN: P(k) proportional to k ** -alpha (most short, a few very long)."""
    weights = [k**-alpha for k in range(1, MAX_CHAIN + 1)]
    return rng.choices(range(1, MAX_CHAIN + 1), weights)[0]


def make_task(index: int, seed: int = 0, length: int | None = None) -> Task:
    """Toy task ``index`` of the suite with ``seed`` (the same arguments always give the same task)."""
    rng = random.Random(f"gyre-toy/{seed}/{index}")
    length = length or chain_length(rng)
    names: list[str] = []
    while len(names) < length + 4:  # the chain, then the decoys
        name = "".join(rng.choices(ALPHABET, k=3))
        if name not in names and name not in (END, START, TRAIL):
            names.append(name)
    chain, decoys = names[:length], names[length:]
    files = {START: chain[0] + "\n"}
    for here, there in zip(chain, [*chain[1:], END], strict=True):
        files[here] = there + "\n"
    for decoy in decoys:
        files[decoy] = rng.choice(names) + "\n"
    return Task(
        id=f"toy-{seed}-{index:04d}",
        instruction=INSTRUCTION,
        files=dict(sorted(files.items())),
        time_budget_s=60.0 + 15.0 * length,
        metadata={"suite": "toy", "chain_length": str(length)},
        hidden_files={"tests/expected.txt": "\n".join([*chain, END]) + "\n", "tests/score.py": SCORE_SCRIPT},
        verifier=VerifierSpec(
            commands=("python3 tests/score.py",),
            result="reward_file",
            report_path="tests/reward.txt",
            timeout_s=60.0,
        ),
        limits=TaskLimits(max_turns=length + 6),
        expert="toy-chain",
    )


def toy_suite(count: int = 64, seed: int = 0) -> list[Task]:
    """``count`` toy tasks; a fixed ``seed`` gives a fixed evaluation set."""
    return [make_task(i, seed) for i in range(count)]


_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)
_NAME = re.compile(rf"^[{ALPHABET}]{{3}}$")


def expert_reply(prompt: str) -> str:
    """The expert's next assistant message (Hermes tool-call markup) for a rendered ChatML ``prompt``."""
    turns = prompt.rsplit("<|im_start|>assistant", 1)[0]
    responses = _RESPONSE.findall(turns.rsplit("<|im_start|>user", 1)[-1])
    if not responses:  # the task's first step
        return _bash(f"cat {START} | tee -a {TRAIL}")
    stdout = responses[-1].split("stdout:\n", 1)[-1].strip().splitlines()
    shown = stdout[-1].strip() if stdout else ""
    if shown == END:
        return _call("submit", {"answer": "done"})
    if _NAME.match(shown):
        return _bash(f"cat {shown} | tee -a {TRAIL}")
    return _call("submit", {"answer": f"lost the chain at {shown!r}"})


GIVE_UP = 0.2  # the impatient expert's chance of submitting at each name it is shown, instead of following it


def impatient_reply(prompt: str) -> str:
    """`expert_reply`, except that at each name shown it gives up with probability ``GIVE_UP`` (a hash of the
    conversation so far decides: the same conversation, the same choice) and submits what it has."""
    reply = expert_reply(prompt)
    if '"name": "bash"' in reply and f"cat {START} " not in reply:
        draw = int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=8).digest(), "big") / 2**64
        if draw < GIVE_UP:
            return _call("submit", {"answer": "done"})
    return reply


def _bash(command: str) -> str:
    return _call("bash", {"command": command})


def _call(name: str, arguments: dict[str, str]) -> str:
    import json

    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'

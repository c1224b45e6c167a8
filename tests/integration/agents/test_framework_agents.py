"""Python agents: openai-agents, langgraph and smolagents (the real packages) as the agents of executions.

A scripted model at the engine edge stands in for a capable one and writes Hermes tool calls; each framework's own
parser sees ``tool_calls``, runs its ``bash`` tool in the execution's bubblewrap sandbox (the verifier scores the
file it wrote) and then submits. Every call is recorded token-exactly, each extending the one before it (except
smolagents', which rewrites its own history). A callable
that raises, or hangs in its thread past the deadline, is its execution's outcome; a bad ``python:`` name is refused
before anything runs.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path

import pytest

from fakes import ScriptedEngine
from gyre.agents.python import load
from gyre.config import RouterConfig, SandboxConfig
from gyre.driver.evaluation import agent_spec
from gyre.engine.models import load_tokenizer
from gyre.errors import AgentError, ConfigError
from gyre.journal.records import expand_inputs
from gyre.router.routing import Router
from gyre.runtime import ExecutionResult, ExecutionSpec, PythonAgentSpec, Runtime
from gyre.tasks import Task
from gyre.tasks.task import VerifierSpec

pytestmark = pytest.mark.filterwarnings(
    # create_react_agent's successor is in the `langchain` package, not installed; examples/ call it as users do
    "ignore::langgraph.warnings.LangGraphDeprecatedSinceV10",
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TASK = Task(
    id="answer",
    instruction="Write 42 into answer.txt, then submit.",
    verifier=VerifierSpec(commands=("grep -qx 42 answer.txt",)),
    time_budget_s=120.0,
)


def call(name: str, **arguments: str) -> str:
    """A reply with a thought and one Hermes tool call, as the chat template writes it."""
    return f"Next step.\n<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def run(tiny_model: Path, engine_url: str, specs: list[ExecutionSpec]) -> list[ExecutionResult]:
    async def go() -> list[ExecutionResult]:
        router = Router(RouterConfig(model_path=str(tiny_model), engines=[engine_url]))
        runtime = Runtime(router, SandboxConfig())
        try:
            return await runtime.run(specs)
        finally:
            await runtime.aclose()
            await router.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("target", "submit"),
    [
        ("gyre.agents.frameworks:openai_agents", ("submit", "summary")),
        ("gyre.agents.frameworks:openai_agents_responses", ("submit", "summary")),  # its default model
        ("gyre.agents.frameworks:langgraph", ("submit", "summary")),
        ("gyre.agents.frameworks:smolagents", ("final_answer", "answer")),  # smolagents' own, ending its run
        (f"{EXAMPLES}/openai_agents_agent.py:agent", ("submit", "summary")),
        (f"{EXAMPLES}/langgraph_agent.py:agent", ("submit", "summary")),
        (f"{EXAMPLES}/smolagents_agent.py:agent", ("final_answer", "answer")),
    ],
    ids=[
        "openai-agents",
        "openai-agents-responses",
        "langgraph",
        "smolagents",
        "example-openai-agents",
        "example-langgraph",
        "example-smolagents",
    ],
)
def test_a_framework_agent_runs_its_tools_in_the_sandbox_and_submits(
    target: str, submit: tuple[str, str], tiny_model: Path
) -> None:
    tokenizer = load_tokenizer(tiny_model)
    steps = [
        call("bash", command="echo 42 > answer.txt && cat answer.txt"),
        call(submit[0], **{submit[1]: "wrote it"}),
    ]

    def script(ids: list[int]) -> str:  # step k once the conversation holds k bash results
        return steps[min(tokenizer.decode(ids).count("exit code: "), len(steps) - 1)]

    agent = agent_spec(f"python:{target}", [TASK])
    with ScriptedEngine(tokenizer, script) as fake:
        (result,) = run(tiny_model, fake.url, [ExecutionSpec(task=TASK, agent=agent)])

    assert result.status == "done" and result.agent is not None, result.error
    assert result.agent.status == "submitted" and result.agent.answer == "wrote it", result.agent.detail
    assert result.verdict is not None and result.reward == 1.0, result.verdict  # the file the sandbox wrote
    records = result.records
    assert len(records) == len(fake.requests) == 2
    first = tokenizer.decode(fake.requests[0]["input_ids"])
    assert TASK.instruction in first and '"bash"' in first  # its prompt, its tools rendered
    assert "exit code: 0" in tokenizer.decode(records[1].new_input_ids)  # the tool's result came back
    assert "42" in tokenizer.decode(records[1].new_input_ids)
    # token-exact: the inputs rebuilt from the deltas are what the engine received; one growing conversation
    inputs = expand_inputs(records)
    assert [inputs[r.call_id] for r in records] == [req["input_ids"] for req in fake.requests]
    if submit[0] == "final_answer":
        # smolagents rewrites its history (a tool call becomes "Calling tools: [...]" text, its result a user
        # message): the second call does not extend the tokens of the first, so it starts a new branch
        assert records[1].parent_call_id is None
        assert "Calling tools:" in tokenizer.decode(fake.requests[1]["input_ids"])
    else:
        assert records[1].parent_call_id == records[0].call_id and records[1].prefix_len > 0


AGENTS = '''
import threading, time

from gyre.agents.contract import AgentResult

released = threading.Event()


def sync_agent(ctx):
    """A sync callable: its own thread; the sandbox through the _sync helpers."""
    out = ctx.bash_sync("echo 42 > answer.txt; cat answer.txt")
    ctx.write_file_sync("notes.txt", ctx.read_file_sync("answer.txt").strip() + " checked")
    return f"{out} / {ctx.base_url} / {ctx.max_steps}"


async def waker(ctx):
    released.set()
    return "woke the other"


def waiter(ctx):
    """Blocks its thread until the async agent has run (it could not if this blocked the loop)."""
    assert released.wait(60), "the event loop was blocked"
    ctx.submit("both ran")


async def other_session(ctx):
    """Its port serves its own session only: another token, even a well-formed one, is refused."""
    import openai

    url = ctx.base_url.replace(ctx.api_key, "x" + ctx.api_key[1:])
    async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as client:
        try:
            await client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "hi"}])
        except openai.AuthenticationError as exc:
            return f"refused {exc.status_code}"
    return "served"


def exits(ctx):
    raise SystemExit(3)  # as a CLI-minded library does


async def broken(ctx):
    await ctx.bash("echo 42 > answer.txt")
    raise ValueError("the framework fell over")


stop_hanging, went_on, refused = threading.Event(), threading.Event(), []


def hung(ctx):
    ctx.bash_sync("true")
    stop_hanging.wait()  # past its deadline: the runtime must not wait for it
    try:
        ctx.bash_sync("true")
    except Exception as exc:  # the execution is over: its sandbox is gone
        refused.append(exc)
    went_on.set()


not_callable = 42
'''


@pytest.fixture
def agents_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_agents.py"
    path.write_text(textwrap.dedent(AGENTS))
    return path


def test_callables_sync_and_async_share_the_loop_and_failures_are_outcomes(
    agents_file: Path, tiny_model: Path
) -> None:
    def spec(name: str, budget_s: float = 120.0) -> ExecutionSpec:
        task = Task(id=name, instruction="x", verifier=TASK.verifier, time_budget_s=budget_s)
        return ExecutionSpec(task=task, agent=agent_spec(f"python:{agents_file}:{name}", [task]))

    tokenizer = load_tokenizer(tiny_model)
    with ScriptedEngine(tokenizer, lambda ids: "unused") as fake:
        results = run(
            tiny_model,
            fake.url,
            [
                spec("sync_agent"),
                spec("waiter"),
                spec("waker"),
                spec("other_session"),
                spec("broken"),
                spec("exits"),
                spec("hung", budget_s=3.0),
            ],
        )
    done, waiter, waker, other, broken, exits, hung = results
    assert done.status == "done" and done.agent is not None and done.agent.status == "finished", done.error
    assert done.agent.answer is not None and done.agent.answer.startswith("exit code: 0\nstdout:\n42")
    assert "/s/" in done.agent.answer and done.agent.answer.endswith(
        "/v1 / 30"
    )  # its session's URL, its limit
    assert done.reward == 1.0  # what bash wrote in the sandbox
    assert (
        waiter.agent is not None and waiter.agent.status == "submitted" and waiter.agent.answer == "both ran"
    )
    assert waker.status == "done"
    assert other.agent is not None and other.agent.answer == "refused 401"
    # a callable that raises: the execution is done, the agent gave up with the traceback, the verdict stands
    assert broken.status == "done" and broken.agent is not None and broken.agent.status == "gave_up"
    assert "ValueError: the framework fell over" in broken.agent.detail and broken.reward == 1.0
    assert (
        exits.agent is not None and exits.agent.status == "gave_up" and "SystemExit: 3" in exits.agent.detail
    )
    # one that never returns from its thread: the deadline ends it and nothing waits for the thread
    assert hung.status == "budget_exceeded" and hung.agent is None and hung.reward == 0.0
    assert not fake.requests  # none of them called the model
    # released after its execution ended, the hung thread finds its helpers refusing
    load(f"{agents_file}:stop_hanging.set")()
    assert load(f"{agents_file}:went_on.wait")(60), "the hung agent's thread did not go on"
    (error,) = load(f"{agents_file}:refused.copy")()
    assert isinstance(error, AgentError) and "is over" in str(error)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("python:", "needs a callable after 'python:'"),
        ("python:no_such_module_xyz:agent", "cannot import no_such_module_xyz"),
        ("python:gyre.agents.frameworks:nope", "has no attribute 'nope'"),
        ("python:gyre.agents.frameworks", "expected MODULE:ATTR"),
        ("python:/no/such/file.py:agent", "no file /no/such/file.py"),
        ("python:{agents}:not_callable", "is a int, not a callable"),
        ("python:{agents}:missing", "has no attribute 'missing'"),
        ("pyhton:x:y", "expected builtin, oracle, command:ARGV or python:MODULE:ATTR"),
    ],
)
def test_a_bad_python_agent_name_is_a_clear_config_error(name: str, says: str, agents_file: Path) -> None:
    with pytest.raises(ConfigError, match=None) as caught:
        agent_spec(name.format(agents=agents_file), [TASK])
    assert says in str(caught.value)


def test_a_file_agent_is_named_by_its_absolute_path(
    agents_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(agents_file.parent)
    spec = agent_spec("python:my_agents.py:sync_agent", [TASK])
    assert spec == PythonAgentSpec(target=f"{agents_file}:sync_agent")  # shards may start elsewhere

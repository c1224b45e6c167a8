"""A smolagents ToolCallingAgent as a Gyre agent: write a function of a `ScaffoldContext`, point Gyre at it.

    gyre eval --suite toy --agent python:examples/smolagents_agent.py:agent --model-path models/tiny
    gyre train run.toml --set 'run.agent="python:examples/smolagents_agent.py:agent"'   # or in run.toml's [run]

smolagents is synchronous, so this is a plain function: Gyre runs it in a thread of its own (the event loop keeps
serving the other executions) and its tools use the ``_sync`` helpers (``ctx.bash_sync``). ``ctx.base_url`` and
``ctx.api_key`` are the execution's router session (every model call is recorded token-exactly, and trained on by
``gyre train``). smolagents' own ``final_answer`` tool ends the run; its argument is the answer. Needs
``pip install 'smolagents[openai]'``.
"""

from __future__ import annotations

from smolagents import OpenAIServerModel, ToolCallingAgent, tool
from smolagents.monitoring import LogLevel

from gyre.agents.python import ScaffoldContext


def agent(ctx: ScaffoldContext) -> str:
    """Solve ``ctx.task`` with a bash tool, until the model calls final_answer."""

    @tool
    def bash(command: str) -> str:
        """Run a bash command in the task's workspace; returns its exit code and output.

        Args:
            command: the command line to run.
        """
        return ctx.bash_sync(command)

    model = OpenAIServerModel(
        model_id=ctx.model,
        api_base=ctx.base_url,
        api_key=ctx.api_key,
        client_kwargs={"max_retries": 0},  # the router already retries engines
        temperature=ctx.temperature,
    )
    solver = ToolCallingAgent(
        tools=[bash], model=model, max_steps=ctx.max_steps, verbosity_level=LogLevel.OFF
    )
    with model.client:  # closed when the execution is over
        answer = str(solver.run(ctx.task))
    ctx.submit(answer)
    return answer

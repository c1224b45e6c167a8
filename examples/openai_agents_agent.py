"""An openai-agents agent as a Gyre agent: write an async function of a `ScaffoldContext`, point Gyre at it.

    gyre eval --suite toy --agent python:examples/openai_agents_agent.py:agent --model-path models/tiny
    gyre train run.toml --set 'run.agent="python:examples/openai_agents_agent.py:agent"'   # or in run.toml's [run]

It runs in Gyre's own process, one call per execution: ``ctx.base_url`` and ``ctx.api_key`` are that execution's
router session (every model call is recorded token-exactly, and trained on by ``gyre train``), ``ctx.bash`` runs a
command in the execution's sandbox, ``ctx.submit`` says the task is done. The model is the chat-completions one,
and tracing is off (it would upload traces to OpenAI). Needs ``pip install openai-agents``.
"""

from __future__ import annotations

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    StopAtTools,
    function_tool,
)
from openai import AsyncOpenAI

from gyre.agents.python import ScaffoldContext


async def agent(ctx: ScaffoldContext) -> str:
    """Solve ``ctx.task`` with a bash tool, until the model calls submit."""

    @function_tool
    async def bash(command: str) -> str:
        """Run a bash command in the task's workspace; returns its exit code and output."""
        return await ctx.bash(command)

    @function_tool
    def submit(summary: str) -> str:
        """Submit the finished task with a one-line summary."""
        return ctx.submit(summary)

    async with AsyncOpenAI(
        base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0
    ) as client:  # no retries:
        assistant = Agent(  # the router already retries engines
            name="assistant",
            instructions="Use bash to do the task, then call submit.",
            tools=[bash, submit],
            model=OpenAIChatCompletionsModel(model=ctx.model, openai_client=client),
            model_settings=ModelSettings(temperature=ctx.temperature, max_tokens=ctx.max_tokens),
            tool_use_behavior=StopAtTools(stop_at_tool_names=["submit"]),
        )
        result = await Runner.run(
            assistant, ctx.task, max_turns=ctx.max_steps, run_config=RunConfig(tracing_disabled=True)
        )
    return str(result.final_output)

"""A langgraph ReAct agent as a Gyre agent: write an async function of a `ScaffoldContext`, point Gyre at it.

    gyre eval --suite toy --agent python:examples/langgraph_agent.py:agent --model-path models/tiny
    gyre train run.toml --set 'run.agent="python:examples/langgraph_agent.py:agent"'   # or in run.toml's [run]

It runs in Gyre's own process, one call per execution: ``ctx.base_url`` and ``ctx.api_key`` are that execution's
router session (every model call is recorded token-exactly, and trained on by ``gyre train``), ``ctx.bash`` runs a
command in the execution's sandbox, ``ctx.submit`` says the task is done. The returned text is the agent's answer;
an exception is recorded as the execution giving up. Needs ``pip install langgraph langchain-openai``.
"""

from __future__ import annotations

import httpx
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

from gyre.agents.python import ScaffoldContext


async def agent(ctx: ScaffoldContext) -> str:
    """Solve ``ctx.task`` with a bash tool, until the model calls submit."""

    @tool
    async def bash(command: str) -> str:
        """Run a bash command in the task's workspace; returns its exit code and output."""
        return await ctx.bash(command)

    @tool(return_direct=True)  # the graph ends here
    def submit(summary: str) -> str:
        """Submit the finished task with a one-line summary."""
        return ctx.submit(summary)

    async with httpx.AsyncClient() as http:  # closed when the execution is over
        model = ChatOpenAI(
            base_url=ctx.base_url,
            api_key=ctx.api_key,
            model=ctx.model,
            temperature=ctx.temperature,  # gyre train asks for the temperature its loss assumes
            max_tokens=ctx.max_tokens,
            max_retries=0,  # the router already retries engines
            http_async_client=http,
        )
        graph = create_react_agent(model, [bash, submit], prompt="Use bash to do the task, then call submit.")
        state = await graph.ainvoke(
            {"messages": [("user", ctx.task)]}, {"recursion_limit": 2 * ctx.max_steps}
        )
    return str(state["messages"][-1].content)

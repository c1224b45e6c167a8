"""Ready-made agents of three agent frameworks, each a `gyre.agents.python` callable with two tools (``bash`` in the
execution's sandbox, and a submit tool that ends the run) and the task's instruction as its prompt::

    gyre eval --suite toy --agent python:gyre.agents.frameworks:openai_agents
    gyre eval --suite toy --agent python:gyre.agents.frameworks:openai_agents_responses  # its default model
    gyre eval --suite toy --agent python:gyre.agents.frameworks:langgraph
    gyre eval --suite toy --agent python:gyre.agents.frameworks:smolagents
    # gyre train: [run] agent = "python:gyre.agents.frameworks:langgraph"

Each talks to its router session through ``/v1/chat/completions`` (``openai_agents_responses``, openai-agents'
default model: ``/v1/responses``) with the official ``openai`` client underneath, asks for the run's temperature and
per-call token limit, stops after ``max_steps`` model calls, and makes no retries of its own (the router retries
engines; a failed call is the execution's outcome). Calls time out at the deadline. The frameworks are imported when
an agent runs (they are heavy, and optional: ``pip install openai-agents``, ``langgraph langchain-openai``,
``smolagents[openai]``).
"""

from __future__ import annotations

import warnings
from typing import Any

from gyre.agents.contract import AgentResult
from gyre.agents.python import ScaffoldContext

SYSTEM = (
    "You are solving a task in a Linux sandbox with no network. Run shell commands with the `bash` tool; they run "
    "in the task's workspace. When the task is done, call `{submit}` with a one-line summary."
)
BASH_DOC = "Run a bash command in the task's workspace and return its exit code and output."
# what create_react_agent answers instead of a last call's tool calls when its recursion limit is near (documented)
LANGGRAPH_OUT_OF_STEPS = "Sorry, need more steps to process this request."
SUBMIT_DOC = "Submit the finished task with a one-line summary of what was done; this ends the run."


def _timeout_s(ctx: ScaffoldContext) -> float:
    """One model call's HTTP timeout: never past the deadline."""
    return max(ctx.remaining_s(), 1.0)


async def openai_agents(ctx: ScaffoldContext) -> AgentResult | str | None:
    """An openai-agents ``Agent`` run by ``Runner`` on its chat-completions model, tracing off."""
    return await _openai_agents(ctx, responses=False)


async def openai_agents_responses(ctx: ScaffoldContext) -> AgentResult | str | None:
    """The same agent on openai-agents' default model, ``OpenAIResponsesModel`` (the router's ``/v1/responses``)."""
    return await _openai_agents(ctx, responses=True)


async def _openai_agents(ctx: ScaffoldContext, responses: bool) -> AgentResult | str | None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        RunConfig,
        Runner,
        StopAtTools,
        function_tool,
    )
    from agents.exceptions import MaxTurnsExceeded
    from openai import AsyncOpenAI

    @function_tool(description_override=BASH_DOC)
    async def bash(command: str) -> str:
        return await ctx.bash(command)

    @function_tool(description_override=SUBMIT_DOC)
    def submit(summary: str) -> str:
        return ctx.submit(summary)

    client = AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0, timeout=_timeout_s(ctx))
    agent = Agent(
        name="gyre",
        instructions=SYSTEM.format(submit="submit"),
        tools=[bash, submit],
        model=(OpenAIResponsesModel if responses else OpenAIChatCompletionsModel)(
            model=ctx.model, openai_client=client
        ),
        model_settings=ModelSettings(temperature=ctx.temperature, max_tokens=ctx.max_tokens),
        tool_use_behavior=StopAtTools(stop_at_tool_names=["submit"]),
    )
    try:
        result = await Runner.run(
            agent, ctx.task, max_turns=ctx.max_steps, run_config=RunConfig(tracing_disabled=True)
        )
    except MaxTurnsExceeded:
        return AgentResult(status="step_limit", answer=ctx.submitted, steps=ctx.max_steps)
    finally:
        await client.close()
    return str(result.final_output) if result.final_output is not None else None


async def langgraph(ctx: ScaffoldContext) -> AgentResult | str | None:
    """langgraph's prebuilt ReAct agent on langchain-openai's ``ChatOpenAI``."""
    import httpx
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.errors import GraphRecursionError
    from langgraph.prebuilt import create_react_agent
    from langgraph.warnings import LangGraphDeprecatedSinceV10

    @tool(description=BASH_DOC)
    async def bash(command: str) -> str:
        return await ctx.bash(command)

    @tool(description=SUBMIT_DOC, return_direct=True)  # the graph ends on it
    def submit(summary: str) -> str:
        return ctx.submit(summary)

    # a client of its own, closed at the end: langchain-openai otherwise keeps one per base URL (one per execution)
    http = httpx.AsyncClient()
    model = ChatOpenAI(
        base_url=ctx.base_url,
        api_key=ctx.api_key,  # type: ignore[arg-type]  # a str is taken as the secret
        model=ctx.model,
        temperature=ctx.temperature,
        max_tokens=ctx.max_tokens,  # type: ignore[call-arg]  # an alias of max_completion_tokens
        max_retries=0,
        timeout=_timeout_s(ctx),
        http_async_client=http,
    )
    with warnings.catch_warnings():
        # its successor, langchain.agents.create_agent, is in the `langchain` package, not needed here
        warnings.filterwarnings("ignore", category=LangGraphDeprecatedSinceV10)
        graph = create_react_agent(model, [bash, submit], prompt=SYSTEM.format(submit="submit"))
    try:
        # a step is a model call and the tool calls it made: two graph super-steps (the last call's tools run)
        state: dict[str, Any] = await graph.ainvoke(
            {"messages": [("user", ctx.task)]}, {"recursion_limit": 2 * ctx.max_steps}
        )
    except GraphRecursionError:
        return AgentResult(status="step_limit", answer=ctx.submitted, steps=ctx.max_steps)
    finally:
        await http.aclose()
    last = state["messages"][-1]
    text = last.content if isinstance(last.content, str) else str(last.content)
    if ctx.submitted is None and text == LANGGRAPH_OUT_OF_STEPS:  # it dropped the last call's tool calls
        return AgentResult(status="step_limit", steps=ctx.max_steps, detail=text)
    return text


def smolagents(ctx: ScaffoldContext) -> AgentResult | str | None:
    """smolagents' ``ToolCallingAgent`` on ``OpenAIServerModel``; its own ``final_answer`` tool is the submit tool.

    smolagents is synchronous: this runs in a thread of its own and its tools use the ``_sync`` helpers."""
    from smolagents import OpenAIServerModel, Tool, ToolCallingAgent
    from smolagents.monitoring import LogLevel

    class Bash(Tool):
        name = "bash"
        description = BASH_DOC
        inputs = {"command": {"type": "string", "description": "the command line"}}  # noqa: RUF012
        output_type = "string"

        def forward(self, command: str) -> str:
            return ctx.bash_sync(command)

    class FinalAnswer(Tool):
        name = "final_answer"
        description = SUBMIT_DOC
        inputs = {"answer": {"type": "string", "description": "what was done"}}  # noqa: RUF012
        output_type = "string"

        def forward(self, answer: str) -> str:
            return ctx.submit(answer) and answer

    settings: dict[str, Any] = {}
    if ctx.temperature is not None:
        settings["temperature"] = ctx.temperature
    if ctx.max_tokens is not None:
        settings["max_tokens"] = ctx.max_tokens
    model = OpenAIServerModel(
        model_id=ctx.model,
        api_base=ctx.base_url,
        api_key=ctx.api_key,
        client_kwargs={"max_retries": 0, "timeout": _timeout_s(ctx)},
        **settings,
    )
    agent = ToolCallingAgent(
        tools=[Bash(), FinalAnswer()],
        model=model,
        max_steps=max(ctx.max_steps - 1, 1),  # out of steps, it makes one more call for an answer
        instructions=SYSTEM.format(submit="final_answer"),
        verbosity_level=LogLevel.OFF,
    )
    try:
        answer = agent.run(ctx.task)
    finally:
        model.client.close()
    if ctx.submitted is None:  # out of steps: smolagents asked the model for an answer without tools
        return AgentResult(status="step_limit", answer=None, steps=ctx.max_steps, detail=str(answer))
    return ctx.submitted

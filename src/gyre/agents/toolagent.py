"""Gyre's built-in tool-calling agent: bash, read/write/edit files, list, submit, delegate to a sub-agent.

When the conversation passes its token budget it compacts: a summary call (role ``main-summary``) and a fresh
context that starts from the summary, which the router records as a new branch of the trajectory tree. ``delegate``
runs a sub-agent with its own context (role ``sub-agent``) in the same sandbox and returns its answer.

A task may ask two things of the agent in its metadata (a long-horizon workload, `gyre.tasks.long`, does):
``CONTEXT_BUDGET_KEY`` replaces ``context_budget_tokens`` ("0": never compact, so the records hold one path of the
whole execution), and ``IDLE_COMMAND_KEY`` names a shell command whose output answers, with the nudge, a reply that
calls no tool (a policy that does not call tools yet still sees the environment's output grow its context).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shlex
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from gyre.agents.contract import AgentContext, AgentResult, AgentStatus
from gyre.errors import ContextOverflow, SandboxError
from gyre.journal.records import Role

SYSTEM_PROMPT = """You are an autonomous software engineer working in a sandboxed Linux workspace (your current \
directory). Use the tools to inspect and change files and run commands. When the task is complete, call `submit` \
with a short answer. Call exactly the tools you need; every call costs time."""

# A short prompt for small models (the tiny preset attends over every prompt token it trains on): two tools, one line.
LEAN_SYSTEM_PROMPT = "Use the tools. Call `submit` when done."
LEAN_TOOLS = ("bash", "submit")

NUDGE = "Use a tool, or call `submit` when you are done."
# task metadata: compact past this many tokens; 0: never
CONTEXT_BUDGET_KEY = "gyre.agent.context_budget_tokens"
IDLE_COMMAND_KEY = "gyre.agent.idle_command"  # task metadata: its output follows the nudge after no tool call

SUMMARY_REQUEST = """Your context is full. Summarize for yourself everything needed to finish the task: what is \
done, what you learned (file names, commands, results), and what remains. Reply with the summary only."""


def _tool(name: str, description: str, **properties: tuple[str, str]) -> dict[str, Any]:
    props = {k: {"type": t, "description": d} for k, (t, d) in properties.items()}
    params = {"type": "object", "properties": props, "required": list(properties)}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


TOOLS = [
    _tool("bash", "Run a shell command in the workspace; returns exit code, stdout and stderr.",
          command=("string", "the command")),
    _tool("read_file", "Read a text file.", path=("string", "path relative to the workspace")),
    _tool("write_file", "Create or overwrite a file.", path=("string", "path"), content=("string", "the text")),
    _tool("edit", "Replace one exact occurrence of `old` by `new` in a file.",
          path=("string", "path"), old=("string", "text to find, exactly once"), new=("string", "replacement")),
    _tool("list", "List a directory.", path=("string", "directory, '.' for the workspace")),
    _tool("submit", "Finish the task with your answer.", answer=("string", "the final answer")),
]  # fmt: skip
DELEGATE = _tool("delegate", "Hand a self-contained sub-task to a helper with a fresh context; returns its answer.",
                 task=("string", "what the helper must do and report"))  # fmt: skip


class BuiltinAgentConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Knobs of the built-in agent."""

    max_steps: int = 50  # model calls of the main context
    context_budget_tokens: int = 24_000  # compact when a call's prompt + completion passes this
    max_tokens_per_call: int = 2048
    temperature: float = 1.0
    command_timeout_s: float = 120.0
    max_tool_output_chars: int = 8_000  # longer tool output is cut in the middle
    delegation: bool = True  # offer the `delegate` tool (not to sub-agents themselves)
    sub_agent_max_steps: int = 20
    modelled_tool_latency_s: float = (
        0.0  # extra seconds after each model call, as if tools ran that long (benchmarks)
    )
    profile: Literal["default", "lean"] = "default"  # lean: only bash and submit, a one-line system prompt
    # Give up after this many model calls in a row that call no tool (each is nudged first); 0: never. An untrained
    # model's prose is answered with a nudge it cannot read: capped, its execution ends at once, scored as it stands.
    max_idle_calls: int = 0
    # Sampling seed of the execution's calls; None: the engine's own generator. With a seed, call k of task T's
    # execution g samples with a seed drawn from (seed, T, g, k): the same execution under other weights samples
    # with the same random numbers (evaluations before and after training compare pairwise).
    seed: int | None = None


CUT_MARK = "\n\n[... {cut:,} characters of the task description cut here to fit the model's context ...]\n\n"


def shorten(text: str, keep: float = 0.5, least: int = 2000) -> str | None:
    """``text`` cut to ``keep`` of its length in its middle (its start, the task's statement, kept three times longer
    than its end), the cut marked; None when it is already under ``least`` characters."""
    if len(text) < least:
        return None
    kept = int(len(text) * keep)
    head = kept * 3 // 4
    tail = kept - head
    return text[:head] + CUT_MARK.format(cut=len(text) - kept) + text[len(text) - tail :]


def call_seed(seed: int, ctx: AgentContext, role: str, call: int) -> int:
    """The sampling seed of an execution's ``call``-th model call: a stable hash of the run's seed, the task, the
    execution's place in its group and the call, in the range the OpenAI API's ``seed`` takes."""
    key = f"{seed}/{ctx.task.id}/{ctx.group_index}/{role}/{call}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> 1


@dataclass
class _Tally:
    calls: int = 0
    compactions: int = 0
    sub_agents: int = 0


class BuiltinAgent:
    """The tool-calling agent (one instance may run many executions)."""

    def __init__(self, config: BuiltinAgentConfig | None = None) -> None:
        self.config = config or BuiltinAgentConfig()

    async def run(self, ctx: AgentContext) -> AgentResult:
        """Work on the task until it is submitted, the step limit is reached, or the runtime's deadline cancels it."""
        tally = _Tally()
        status, answer, steps, detail = await self._loop(
            ctx, ctx.task.instruction, "main", self.config.max_steps, tally
        )
        return AgentResult(status=status, answer=answer, steps=steps, calls=tally.calls,
                           compactions=tally.compactions, sub_agents=tally.sub_agents, detail=detail)  # fmt: skip

    async def _loop(
        self,
        ctx: AgentContext,
        instruction: str,
        role: Literal["main", "sub-agent"],
        max_steps: int,
        tally: _Tally,
    ) -> tuple[AgentStatus, str | None, int, str]:
        """How it ended: the status, the answer submitted (if any), the main context's calls, and why it gave up."""
        cfg = self.config
        summary_role: Role = "main-summary" if role == "main" else "sub-agent-summary"
        tools = TOOLS + ([DELEGATE] if cfg.delegation and role == "main" else [])
        if cfg.profile == "lean":
            tools = [t for t in tools if t["function"]["name"] in LEAN_TOOLS]
        messages = self._fresh(instruction)
        budget = int(ctx.task.metadata.get(CONTEXT_BUDGET_KEY, cfg.context_budget_tokens)) or None
        idle = ctx.task.metadata.get(IDLE_COMMAND_KEY, "")
        idle_calls = 0  # calls in a row that called no tool
        for step in range(1, max_steps + 1):
            seeded = {} if cfg.seed is None else {"seed": call_seed(cfg.seed, ctx, role, tally.calls)}
            try:
                body = await ctx.client.chat(messages, tools=tools, role=role, temperature=cfg.temperature,
                                             max_tokens=cfg.max_tokens_per_call, **seeded)  # fmt: skip
            except ContextOverflow as exc:
                # a task description longer than the model's context is cut in its middle until it fits; a
                # conversation that outgrew it starts again from the (cut) description: the workspace keeps
                # the work (issue 32: a 77k-token spec crashed the agent)
                if len(messages) <= 2:
                    shorter = shorten(instruction)
                    if shorter is None:
                        return (
                            "gave_up",
                            None,
                            step,
                            f"the task description cannot fit the model's context: {exc}",
                        )
                    instruction = shorter
                messages = self._fresh(instruction)
                continue
            tally.calls += 1
            message = body["choices"][0]["message"]
            messages.append({k: v for k, v in message.items() if v is not None})
            calls = message.get("tool_calls") or []
            idle_calls = 0 if calls else idle_calls + 1
            if cfg.max_idle_calls and idle_calls >= cfg.max_idle_calls:
                return "gave_up", None, step, f"{idle_calls} calls in a row called no tool"
            if not calls:
                nudge = NUDGE if not idle else f"{NUDGE}\n\n`{idle}` printed:\n{await self._bash(ctx, idle)}"
                messages.append({"role": "user", "content": nudge})
            for call in calls:
                result, submitted = await self._run_tool(ctx, call, tally)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
                if submitted is not None:
                    return "submitted", submitted, step, ""
            if cfg.modelled_tool_latency_s > 0:
                await asyncio.sleep(cfg.modelled_tool_latency_s)
            used = body.get("usage", {}).get("total_tokens", 0)
            if budget is not None and used > budget and step < max_steps:
                messages = await self._compact(ctx, instruction, messages, tools, summary_role, tally)
        return "step_limit", None, max_steps, ""

    def _fresh(self, instruction: str, summary: str | None = None) -> list[dict[str, Any]]:
        text = (
            instruction
            if summary is None
            else f"{instruction}\n\nYour progress so far (your own summary):\n{summary}"
        )
        system = LEAN_SYSTEM_PROMPT if self.config.profile == "lean" else SYSTEM_PROMPT
        return [{"role": "system", "content": system}, {"role": "user", "content": text}]

    async def _compact(
        self,
        ctx: AgentContext,
        instruction: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        role: Role,
        tally: _Tally,
    ) -> list[dict[str, Any]]:
        """Summarize, then start a fresh context from the summary (a new branch of the trajectory tree).

        The summary request keeps the tools (``tool_choice`` auto: ``"none"`` would render none), so it extends the
        context it summarises token-exactly; a tool call in its reply is dropped, its text kept.
        """
        request = [*messages, {"role": "user", "content": SUMMARY_REQUEST}]
        cfg = self.config
        seeded = {} if cfg.seed is None else {"seed": call_seed(cfg.seed, ctx, role, tally.calls)}
        try:
            body = await ctx.client.chat(request, tools=tools, role=role,
                                         temperature=cfg.temperature, max_tokens=cfg.max_tokens_per_call,
                                         **seeded)  # fmt: skip
        except ContextOverflow:  # too long even to be summarised: start again from the task alone
            return self._fresh(instruction)
        tally.calls += 1
        tally.compactions += 1
        return self._fresh(instruction, body["choices"][0]["message"].get("content") or "")

    async def _run_tool(
        self, ctx: AgentContext, call: dict[str, Any], tally: _Tally
    ) -> tuple[str, str | None]:
        """The tool's result text and, for `submit`, the answer. Tool failures are results the model sees."""
        name = call.get("function", {}).get("name", "")
        try:
            args = json.loads(call.get("function", {}).get("arguments") or "{}")
            if not isinstance(args, dict):
                raise TypeError("arguments must be a JSON object")
        except (ValueError, TypeError) as exc:
            return f"error: the arguments of `{name}` are not a JSON object: {exc}", None
        try:
            match name:
                case "submit":
                    answer = str(args.get("answer", ""))
                    return "submitted", answer
                case "bash":
                    return await self._bash(ctx, str(args["command"])), None
                case "read_file":
                    data = await ctx.sandbox.read_file(str(args["path"]))
                    return self._cut(data.decode("utf-8", errors="replace")), None
                case "write_file":
                    content = str(args["content"])
                    await ctx.sandbox.write_file(str(args["path"]), content)
                    return f"wrote {len(content.encode())} bytes to {args['path']}", None
                case "edit":
                    return await self._edit(ctx, str(args["path"]), str(args["old"]), str(args["new"])), None
                case "list":
                    return await self._bash(
                        ctx, f"ls -la -- {shlex.quote(str(args.get('path') or '.'))}"
                    ), None
                case "delegate":
                    tally.sub_agents += 1
                    status, reply, _, why = await self._loop(ctx, str(args["task"]), "sub-agent",
                                                             self.config.sub_agent_max_steps, tally)  # fmt: skip
                    return (
                        reply
                        if reply is not None
                        else f"the helper stopped without an answer ({status}{why and ': '}{why})",
                        None,
                    )
                case _:
                    return f"error: there is no tool `{name}`", None
        except KeyError as exc:
            return f"error: `{name}` needs the argument {exc}", None
        except SandboxError as exc:
            return f"error: {exc}", None

    async def _bash(self, ctx: AgentContext, command: str) -> str:
        timeout = max(min(self.config.command_timeout_s, ctx.remaining_s()), 1.0)
        result = await ctx.sandbox.exec(command, timeout_s=timeout)
        text = f"exit code: {result.exit_code}" + (" (timed out)" if result.timed_out else "")
        if result.stdout:
            text += f"\nstdout:\n{result.stdout}"
        if result.stderr:
            text += f"\nstderr:\n{result.stderr}"
        return self._cut(text)

    async def _edit(self, ctx: AgentContext, path: str, old: str, new: str) -> str:
        text = (await ctx.sandbox.read_file(path)).decode("utf-8", errors="replace")
        count = text.count(old) if old else 0
        if count != 1:
            return f"error: `old` occurs {count} times in {path}; it must occur exactly once"
        await ctx.sandbox.write_file(path, text.replace(old, new, 1))
        return f"edited {path}"

    def _cut(self, text: str) -> str:
        limit = self.config.max_tool_output_chars
        if len(text) <= limit:
            return text
        half = limit // 2
        return f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"

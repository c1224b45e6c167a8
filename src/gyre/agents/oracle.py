"""The oracle: writes the task's reference solution into the workspace instead of asking a model.

It validates a suite (`gyre eval --agent oracle`): a task whose oracle scores below 1 is a broken task. Tasks solved
by a scripted expert instead run the built-in agent against the expert (`gyre.tasks.catalog.EXPERTS`).
"""

from __future__ import annotations

from gyre.agents.contract import AgentContext, AgentResult
from gyre.errors import AgentError


class OracleAgent:
    """Writes ``task.solution_files`` and submits; no model calls."""

    async def run(self, ctx: AgentContext) -> AgentResult:
        if not ctx.task.solution_files:
            raise AgentError(f"task {ctx.task.id} has no reference solution for the oracle")
        for path, text in ctx.task.solution_files.items():
            await ctx.sandbox.write_file(path, text)
        detail = f"wrote {len(ctx.task.solution_files)} solution files"
        if ctx.task.solution_command:
            result = await ctx.sandbox.exec(ctx.task.solution_command, timeout_s=max(ctx.remaining_s(), 1.0))
            if not result.ok:
                raise AgentError(
                    f"the reference solution's command failed (exit {result.exit_code}): {result.stderr[-500:]}"
                )
            detail += f" and ran {ctx.task.solution_command!r}"
        return AgentResult(status="submitted", detail=detail)

"""The agent contract: given a context, run until done. A failure is recorded on the execution, never raised past it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import msgspec

from gyre.tasks.task import Task

if TYPE_CHECKING:
    from gyre.agents.modelclient import ModelClient
    from gyre.sandbox import Sandbox

AgentStatus = Literal["submitted", "finished", "step_limit", "gave_up"]


class AgentResult(msgspec.Struct, frozen=True, kw_only=True):
    """How an agent's run ended, in its own words (the runtime adds budget and crash outcomes)."""

    status: AgentStatus
    answer: str | None = None  # what the agent submitted, if anything
    steps: int = 0  # model calls of the main context
    calls: int = 0  # model calls in all, summaries and sub-agents included
    compactions: int = 0
    sub_agents: int = 0
    detail: str = ""


@dataclass
class AgentContext:
    """Everything an agent may use: its model client, its sandbox, its task and its deadline."""

    execution_id: str
    task: Task
    client: ModelClient
    sandbox: Sandbox
    deadline: float  # time.monotonic() by which the execution must end
    group_index: int = 0  # which of its task's group this execution is
    base_url: str = ""  # the session's OpenAI base URL, for agents that run an external process
    api_key: str = ""
    model: str = "default"

    def remaining_s(self) -> float:
        """Seconds left before the deadline."""
        return max(self.deadline - time.monotonic(), 0.0)


class Agent(Protocol):
    """Runs one execution of one task."""

    async def run(self, ctx: AgentContext) -> AgentResult:
        """Work on ``ctx.task`` until it is done; may be cancelled at the deadline."""
        ...

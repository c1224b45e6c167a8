"""The task an execution attempts: an instruction, a starting workspace and a time budget."""

from __future__ import annotations

from typing import Annotated

import msgspec


class Task(msgspec.Struct, frozen=True, kw_only=True):
    """One problem. ``files`` are written into the workspace before the agent starts."""

    id: str
    instruction: str
    files: dict[str, str] = msgspec.field(default_factory=dict)  # workspace-relative path -> text
    time_budget_s: Annotated[float, msgspec.Meta(gt=0)] = 3600.0  # wall clock for one execution
    metadata: dict[str, str] = msgspec.field(default_factory=dict)

"""The rollout runtime: thousands of executions, each an agent in its own sandbox, in one event loop."""

from gyre.runtime.runtime import (
    BuiltinAgentSpec,
    CommandAgentSpec,
    ExecutionResult,
    ExecutionSpec,
    Runtime,
    RuntimeStatistics,
)

__all__ = [
    "BuiltinAgentSpec",
    "CommandAgentSpec",
    "ExecutionResult",
    "ExecutionSpec",
    "Runtime",
    "RuntimeStatistics",
]

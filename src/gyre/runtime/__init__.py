"""The rollout runtime: thousands of executions, each an agent in its own sandbox, in one event loop."""

from gyre.runtime.dispatch import (
    AgentSpec,
    BuiltinAgentSpec,
    CommandAgentSpec,
    ExecutionResult,
    ExecutionSpec,
    OracleAgentSpec,
    PythonAgentSpec,
    Runtime,
    RuntimeStatistics,
)

__all__ = [
    "AgentSpec",
    "BuiltinAgentSpec",
    "CommandAgentSpec",
    "ExecutionResult",
    "ExecutionSpec",
    "OracleAgentSpec",
    "PythonAgentSpec",
    "Runtime",
    "RuntimeStatistics",
]

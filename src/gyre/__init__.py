"""Gyre: elastic online reinforcement learning for long-horizon LLM agents.

The Python API a user scripts against. Heavy modules (torch) load on first use of the names that need them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "BuiltinAgent": "gyre.agents.toolagent",
    "BuiltinAgentSpec": "gyre.runtime",
    "CommandAgentSpec": "gyre.runtime",
    "ExecutionResult": "gyre.runtime",
    "ExecutionSpec": "gyre.runtime",
    "Router": "gyre.router.routing",
    "RouterConfig": "gyre.config",
    "Runtime": "gyre.runtime",
    "SandboxConfig": "gyre.config",
    "Task": "gyre.tasks",
    "OracleAgentSpec": "gyre.runtime",
    "Verdict": "gyre.tasks",
    "Verifier": "gyre.tasks",
    "load_suite": "gyre.tasks",
    "load_task": "gyre.tasks",
    "resolve_suite": "gyre.tasks",
    "EvalOptions": "gyre.driver.evaluation",
    "run_eval": "gyre.driver.evaluation",
    "UpstreamRouter": "gyre.router.upstream",
    "expand_inputs": "gyre.journal.records",
    "make_sandbox": "gyre.sandbox",
    "CallRecord": "gyre.journal.records",
    "EmbeddedEngine": "gyre.engine.embedded.asyncengine",
    "EngineClient": "gyre.engine.engineclient",
    "EngineConfig": "gyre.config",
    "GyreConfig": "gyre.config",
    "GyreError": "gyre.errors",
    "SamplingParams": "gyre.protocol",
    "init_model": "gyre.engine.models",
    "launch_embedded": "gyre.engine.launcher",
    "launch_sglang": "gyre.engine.launcher",
    "load_config": "gyre.config",
    "TrainerConfig": "gyre.config",
    "TrainerClient": "gyre.train.trainerclient",
    "Satellite": "gyre.train.satellite",
    "run_core": "gyre.train.coretrainer",
    "launch_core": "gyre.train.trainerclient",
    "launch_satellite": "gyre.train.trainerclient",
    "Rollout": "gyre.train",
    "build_step": "gyre.train",
    "Trainer": "gyre.driver.training",
    "TrainSummary": "gyre.driver.training",
    "RunDir": "gyre.driver.rundir",
    "run_sft": "gyre.driver.sft",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gyre' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

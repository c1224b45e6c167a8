"""Run mini-swe-agent (from PyPI) as a Gyre ``command`` agent on one task, and show its calls in the journal.

    pip install -e '.[dev]'                  # mini-swe-agent is in the dev extra
    python examples/mini_swe_agent.py MODEL_DIR [--engine URL | --set engine.KEY=VALUE ...] [--task TEXT]
                                      [--step-limit N] [--journal DIR]

Without ``--engine`` the embedded engine is started on MODEL_DIR (``gyre init-model models/tiny`` makes a tiny model
that runs on a CPU: it cannot solve anything and mini-swe-agent stops after three badly formatted replies, but
every call still lands in the journal). With ``--engine`` any server speaking SGLang's API serving MODEL_DIR is used.
Each call that continues the conversation extends the one before it token-exactly; a reply mini-swe-agent rejects
(no tool call) is left out of its history, so the call after it starts a new branch.

mini-swe-agent runs inside the execution's sandbox (bubblewrap: no network, the workspace as its home and working
directory) from this Python installation, shown read-only there. Its own ``local`` environment runs the model's
commands in the same sandbox. It reaches its router session through litellm's OpenAI provider, which reads
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` from the environment the command agent is started with.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from gyre.config import RouterConfig, SandboxConfig
from gyre.engine.launcher import launch_embedded
from gyre.router.routing import Router
from gyre.runtime import CommandAgentSpec, ExecutionResult, ExecutionSpec, Runtime
from gyre.tasks import Task

# `mini` with its tool-calling config, without a terminal: no confirmations, no question when it submits.
MINI = (
    '"$0" -m minisweagent -y --exit-immediately -c mini.yaml -c agent.step_limit="$STEP_LIMIT" '
    '-m "openai/$OPENAI_MODEL" -t "$GYRE_TASK" -o traj.json'
)
MINI_ENV = {
    "MSWEA_CONFIGURED": "true",  # skip the interactive first-run setup
    "MSWEA_SILENT_STARTUP": "1",
    "MSWEA_COST_TRACKING": "ignore_errors",  # litellm has no price for a self-served model
    "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",  # the router already retries engines; fail fast otherwise
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm would fetch its price map at import (no network there)
}


def mini_swe_agent(step_limit: int) -> CommandAgentSpec:
    """mini-swe-agent as a command agent: ``python -m minisweagent`` from this installation, in the sandbox."""
    env = {**MINI_ENV, "STEP_LIMIT": str(step_limit)}
    return CommandAgentSpec(argv=["bash", "-c", MINI, sys.executable], env=env, python_env=True)


async def run(model_dir: Path, engine_url: str, spec: ExecutionSpec, journal: Path) -> ExecutionResult:
    """One execution through a router in front of ``engine_url``; calls go to ``journal/calls.jsonl``."""
    cfg = RouterConfig(model_path=str(model_dir), engines=[engine_url], journal_dir=str(journal))
    router = Router(cfg)
    runtime = Runtime(router, SandboxConfig(), journal_dir=str(journal))
    try:
        return await runtime.run_one(spec)
    finally:
        await runtime.aclose()
        await router.aclose()


def main() -> int:
    """Parse the arguments, run the task, print how it ended and its calls."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model_dir", type=Path, help="Hugging Face model directory (chat template and tokenizer)")
    p.add_argument("--engine", help="engine base URL; without it the embedded engine is started on model_dir")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="embedded engine override")
    p.add_argument("--task", default="Write hello.py that prints the answer to 6 * 7, run it, then submit.")
    p.add_argument("--step-limit", type=int, default=20, help="model calls mini-swe-agent may make")
    p.add_argument("--time-budget-s", type=float, default=900.0, help="wall clock for the execution")
    p.add_argument("--journal", type=Path, default=Path("gyre-journal"), help="where the journal is written")
    args = p.parse_args()

    task = Task(id="mini-swe-agent", instruction=args.task, time_budget_s=args.time_budget_s)
    spec = ExecutionSpec(task=task, agent=mini_swe_agent(args.step_limit))
    if args.engine:
        result = asyncio.run(run(args.model_dir, args.engine, spec, args.journal))
    else:
        with launch_embedded(args.model_dir, overrides=args.set) as engine:
            result = asyncio.run(run(args.model_dir, engine.url, spec, args.journal))

    print(f"execution {result.execution_id}: {result.status}", result.error or "")
    if result.agent is not None:
        print(f"agent {result.agent.status}; the end of its output:\n{result.agent.detail[-1500:]}\n")
    for r in result.records:
        parent = f"extends {r.parent_call_id}" if r.parent_call_id else "new branch"
        sizes = f"+{len(r.new_input_ids)} input, {len(r.output_ids)} output tokens"
        print(f"{r.call_id}  {parent}  {sizes}  {r.finish_reason}")
    print(f"\ncalls: {args.journal / 'calls.jsonl'}   executions: {args.journal / 'executions.jsonl'}")
    return 0 if result.status == "done" else 1


if __name__ == "__main__":
    sys.exit(main())

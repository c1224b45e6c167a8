"""`gyre eval`: a model (or a suite's oracle) over a task suite, scored."""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec

from gyre.driver.rundir import default_run_dir
from gyre.errors import ConfigError

EXIT_NOT_CLEAN = 3  # `gyre eval` finished, but dropped executions or (oracle) a reference scoring below 1


def cmd_eval(args: argparse.Namespace) -> int:
    """Run an evaluation and print its summary; `EXIT_NOT_CLEAN` when the summary lists problems."""
    from gyre.config import load_config
    from gyre.driver.evaluation import EvalOptions, print_summary, run_eval

    loaded = load_config(args.config, list(args.set or []))
    sandbox = loaded.sandbox
    if args.ray is not None:
        from gyre.control.placement import import_ray

        import_ray()  # without Ray: how to install it, before anything starts
    name = args.suite.rstrip("/").rsplit("/", 1)[-1].replace(":", "-")
    run_dir = args.run_dir or str(default_run_dir("eval", name))
    try:
        options = EvalOptions(
            suite=args.suite, run_dir=run_dir, agent=args.agent, expert=args.expert, model_path=args.model_path,
            model_name=args.model, engine_url=args.engine_url, base_url=args.base_url, api_key_env=args.api_key_env,
            concurrency=args.concurrency,
            group_size=args.group_size, limit=args.limit, max_steps=args.max_steps, temperature=args.temperature,
            seed=args.seed, sandbox=sandbox, progress=not args.no_progress, agent_profile=args.agent_profile,
            max_tokens_per_call=args.max_tokens_per_call, max_idle_calls=args.max_idle_calls,
            verifier_retries=args.verifier_retries,
            shards=loaded.shards.count if args.shards is None else args.shards, ray=args.ray, placement=loaded.ray,
            shard_settings=loaded.shards,
        )  # fmt: skip
        options = msgspec.convert(msgspec.to_builtins(options), EvalOptions)  # checks the bounds
    except msgspec.ValidationError as exc:
        raise ConfigError(f"bad option: {exc}") from None
    summary = run_eval(options)
    print_summary(summary, run_dir)
    return 0 if summary.ok else EXIT_NOT_CLEAN


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The parsers of `gyre eval`."""
    s = sub.add_parser(
        "eval",
        help="run a model (or a suite's oracle) over a task suite and score it",
        epilog=f"exit status: 0 a clean run; 2 a usage or configuration error; {EXIT_NOT_CLEAN} finished but not "
        "clean (an execution was dropped, or with --agent oracle a reference solution scored below 1)",
    )
    s.add_argument(
        "--suite", required=True, help="toy, toy:N[:SEED], nl2repo-mini, or a suite/task directory"
    )
    s.add_argument(
        "--agent",
        default="builtin",
        help="builtin | oracle (reference solutions / scripted expert) | command:ARGV | python:MODULE:ATTR "
        "(or python:FILE.py:ATTR; e.g. python:gyre.agents.frameworks:langgraph)",
    )
    s.add_argument("--expert", default="", help="the scripted expert --agent oracle plays (default: the suite's; "
                   "toy-chain-impatient gives up partway)")  # fmt: skip
    s.add_argument(
        "--model-path", default="models/tiny", help="model directory (tokenizer; weights to serve)"
    )
    s.add_argument("--model", default="", help="the model name agents send (default: the directory's name)")
    s.add_argument(
        "--engine-url", default="", help="an engine speaking SGLang's API; default: start the embedded one"
    )
    s.add_argument(
        "--base-url",
        default="",
        help="an outside OpenAI-compatible model (e.g. https://host/v1); evaluation only",
    )
    s.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable with its API key")
    s.add_argument("--concurrency", type=int, default=8, help="executions at once")
    s.add_argument("--group-size", type=int, default=1, help="executions per task")
    s.add_argument("--limit", type=int, default=0, help="the first N tasks only")
    s.add_argument(
        "--max-steps", type=int, default=50, help="most agent steps per execution (a task may allow fewer)"
    )
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--seed", type=int, default=None,
                   help="seed the built-in agent's sampling: two evaluations with one seed compare pairwise")  # fmt: skip
    s.add_argument(
        "--max-tokens-per-call", type=int, default=1024, help="the built-in agent's limit per call"
    )
    s.add_argument("--max-idle-calls", type=int, default=0,
                   help="the built-in agent gives up after N calls in a row call no tool (0: never)")  # fmt: skip
    s.add_argument(
        "--verifier-retries", type=int, default=2, help="verifier attempts after the first before dropping"
    )
    s.add_argument(
        "--agent-profile", choices=["default", "lean"], default="default",
        help="the built-in agent's prompt (and the oracle's): lean = bash and submit, a one-line system prompt",
    )  # fmt: skip
    s.add_argument("--run-dir", help="default: runs/eval-SUITE-TIME")
    s.add_argument("--config", type=Path, help="TOML config file ([sandbox], [shards]; with --ray, [ray])")
    s.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="dotted override, e.g. sandbox.memory_mib=512"
    )
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.add_argument("--shards", type=int, default=None,
                   help="runtime shards (processes) running the executions; 0: this process; default: the config's "
                        "shards.count")  # fmt: skip
    s.add_argument(
        "--ray", nargs="?", const="auto", metavar="ADDRESS",
        help="place the shards (at least 1) on a Ray cluster; ADDRESS default: the cluster this machine belongs to",
    )  # fmt: skip
    s.set_defaults(fn=cmd_eval)

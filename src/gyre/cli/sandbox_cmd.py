"""`gyre sandbox run`: one command in the sandbox an agent would get."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gyre.cli.common import run_loop


def cmd_sandbox_run(args: argparse.Namespace) -> int:
    """Run one command in the sandbox an agent would get and print what happened (to check a set-up)."""
    from gyre.config import load_config
    from gyre.sandbox import ExecResult, check_backend, make_sandbox

    overrides = list(args.set or [])
    if args.backend:
        overrides.append(f'sandbox.backend="{args.backend}"')
    cfg = load_config(args.config, overrides).sandbox
    argv = args.cmd[1:] if args.cmd[:1] == ["--"] else list(args.cmd)
    if not argv:
        print("gyre sandbox run: give the command after --, e.g. gyre sandbox run -- ls /", file=sys.stderr)
        return 2
    command: str | list[str] = argv[0] if len(argv) == 1 else argv  # one word or a quoted line: bash -c
    print(f"sandbox: {check_backend(cfg)}", file=sys.stderr)
    results: list[ExecResult] = []

    async def run() -> None:
        async with make_sandbox(cfg, workspace=args.workspace) as sb:
            results.append(await sb.exec(command, timeout_s=args.timeout))

    run_loop(run())
    r = results[0]
    flags = [
        *(["timed out"] if r.timed_out else []),
        *(["output truncated"] if r.truncated else []),
        *([f"killed by {r.killed_by}"] if r.killed_by else []),
        *([f"resource exceeded: {r.resource_exceeded}"] if r.resource_exceeded else []),
    ]
    print(f"exit code: {r.exit_code} ({r.duration_s:.3f} s)")
    print(f"flags: {', '.join(flags) or 'none'}")
    print("--- stdout ---")
    print(r.stdout, end="" if r.stdout.endswith("\n") or not r.stdout else "\n")
    print("--- stderr ---")
    print(r.stderr, end="" if r.stderr.endswith("\n") or not r.stderr else "\n")
    return 124 if r.timed_out else r.exit_code


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The parsers of `gyre sandbox`."""
    s = sub.add_parser("sandbox", help="sandboxes agents run commands in")
    sandbox_sub = s.add_subparsers(dest="sandbox_command", required=True)
    s = sandbox_sub.add_parser(
        "run",
        help="run one command in the sandbox an agent would get; prints its result and what was blocked",
    )
    s.add_argument(
        "--workspace", type=Path, help="bind this directory as the workspace (default: a new empty one)"
    )
    s.add_argument(
        "--backend", choices=["bubblewrap", "local"], help="default: sandbox.backend of the config"
    )
    s.add_argument("--timeout", type=float, help="wall-clock seconds (default: sandbox.default_timeout_s)")
    s.add_argument("--config", type=Path, help="TOML config file ([sandbox] section)")
    s.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="dotted override, e.g. sandbox.memory_mib=512"
    )
    s.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command (one argument: a bash line)")
    s.set_defaults(fn=cmd_sandbox_run)

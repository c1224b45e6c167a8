"""The ``gyre`` command: one module per command group, each adding its parsers and holding its ``cmd_*`` functions.

Each subcommand lazy-imports what it needs, so ``gyre --help`` is instant.
"""

from __future__ import annotations

import argparse
import logging
import sys

from gyre.cli import (
    eval_cmd,
    model_cmd,
    process_cmd,
    quickstart_cmd,
    sandbox_cmd,
    serve_cmd,
    sft_cmd,
    sim_cmd,
    tasks_cmd,
    train_cmd,
)
from gyre.cli.eval_cmd import EXIT_NOT_CLEAN
from gyre.errors import GyreError

__all__ = ["EXIT_NOT_CLEAN", "build_parser", "main"]

# the order of `gyre --help`: what a user runs first, the processes a driver or a cluster starts last
GROUPS = (train_cmd, eval_cmd, quickstart_cmd, sft_cmd, tasks_cmd, sandbox_cmd, sim_cmd, serve_cmd, model_cmd,
          process_cmd)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    p = argparse.ArgumentParser(prog="gyre", description="Elastic online RL for long-horizon LLM agents.")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the ``gyre`` command; a GyreError prints one clear line and exits 2."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.fn(args))
    except GyreError as exc:
        print(f"gyre {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130

"""`gyre sft`: the supervised warm start on demonstrations."""

from __future__ import annotations

import argparse
from pathlib import Path

from gyre.cli.common import override


def cmd_sft(args: argparse.Namespace) -> int:
    """Supervised warm start on demonstration call records; the output directory holds a Gyre checkpoint."""
    from rich.console import Console

    from gyre.config import load_config
    from gyre.driver.sft import run_sft

    overrides = list(args.set or [])
    for key, value in (("sft.journals", args.journal), ("sft.model_path", args.model),
                       ("sft.output_dir", args.output_dir), ("sft.epochs", args.epochs)):  # fmt: skip
        if value is not None:
            overrides.append(override(key, value))
    if args.all_sources:
        overrides.append(override("sft.sources", ["policy", "scripted", "upstream"]))
    s = run_sft(load_config(args.config, overrides), progress=not args.no_progress)
    left_out = f", {sum(s.skipped.values())} calls left out" if s.skipped else ""
    Console().print(
        f"gyre sft: {s.sessions} demonstration sessions ({s.calls} calls{left_out}), {s.steps} steps over "
        f"{s.epochs} epochs, {s.tokens:,} tokens trained ({s.computed_tokens:,} computed, "
        f"{s.tokens_per_s:,.0f}/s), loss {s.loss_first:.3f} -> {s.loss_last:.3f} in {s.total_s:.1f} s; "
        f"checkpoint {s.checkpoint}"
    )
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The parsers of `gyre sft`."""
    s = sub.add_parser("sft", help="supervised warm start on demonstrations (a scripted expert's calls)")
    s.add_argument("config", nargs="?", type=Path, help="the run's TOML ([sft], and [trainer] for AdamW)")
    s.add_argument(
        "--journal",
        action="append",
        help="calls.jsonl, journal or run directory of demonstrations (sft.journals; repeatable)",
    )
    s.add_argument("--model", help="model directory to start from (sft.model_path)")
    s.add_argument("--output-dir", help="where metrics, sft.json and checkpoints go (sft.output_dir)")
    s.add_argument("--epochs", type=int, help="passes over the demonstrations (sft.epochs)")
    s.add_argument(
        "--all-sources",
        action="store_true",
        help="train on every call record (policy, upstream too), not only the scripted expert's",
    )
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="dotted override, e.g. sft.learning_rate=3e-3"
    )
    s.set_defaults(fn=cmd_sft)

"""The tiny models: `gyre init-model` (a preset, randomly initialised) and `gyre pretrain` (the quickstart's)."""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_init_model(args: argparse.Namespace) -> int:
    """Write a Hugging Face model directory from a preset."""
    from gyre.engine.models import count_parameters, init_model

    path = init_model(args.dir, preset=args.preset, seed=args.seed, overwrite=args.overwrite)
    print(f"wrote {args.preset} model ({count_parameters(path):,} parameters) to {path}")
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    """Pretrain the tiny model on shell sessions (the quickstart's starting model); ``--export``: ship it."""
    from gyre.driver.pretrain import ASSET, export, pretrain

    result = pretrain(args.out, seed=args.seed, steps=args.steps, threads=args.threads,
                      progress=not args.no_progress)  # fmt: skip
    print(f"{args.out}: held-out copied names, first digit {result['first_digit']:.3f}, every digit "
          f"{result['every_digit']:.3f}; {result['seconds']:.0f} s")  # fmt: skip
    if args.export:
        print(
            f"shipped as {export(args.out)} (what the quickstart starts from; {ASSET.stat().st_size:,} bytes)"
        )
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The parsers of `gyre init-model`, `gyre pretrain`."""
    s = sub.add_parser("init-model", help="write a Hugging Face model directory from a preset")
    s.add_argument("dir", type=Path)
    s.add_argument("--preset", default="tiny")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--overwrite", action="store_true")
    s.set_defaults(fn=cmd_init_model)

    s = sub.add_parser(
        "pretrain", help="pretrain the tiny model on shell sessions: the quickstart's starting model"
    )
    s.add_argument("--out", default="models/tiny-shell-new", help="the model directory to write")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--steps", type=int, default=1500)
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--export", action="store_true", help="also write it as the checkpoint Gyre ships")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.set_defaults(fn=cmd_pretrain)

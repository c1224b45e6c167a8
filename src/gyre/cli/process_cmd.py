"""One process of a run, as a driver or a cluster starts it: `gyre trainer core|satellite`, `gyre cell`, `gyre shard`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gyre.cli.common import override
from gyre.errors import ConfigError


def cmd_trainer_core(args: argparse.Namespace) -> int:
    """Run the core trainer process (authoritative weights, optimizer, micro-step queue)."""
    from gyre.config import load_config
    from gyre.train.coretrainer import run_core
    from gyre.train.layout import check_run_layout

    overrides = list(args.set or [])
    for key, value in (("model_path", args.model), ("bind", args.bind), ("resume_from", args.resume),
                       ("num_threads", args.threads)):  # fmt: skip
        if value is not None and value != "":
            overrides.append(override(f"trainer.{key}", value))
    cfg = load_config(args.config, overrides).trainer
    layout = check_run_layout(cfg, cfg.resume_from or cfg.model_path)  # a refusal starts nothing
    print(layout, file=sys.stderr)
    run_core(cfg, ready=lambda address: print(f"gyre trainer core: listening at {address}", file=sys.stderr))
    # The core has closed its sockets and groups; gloo's pair objects still connected to live members abort the
    # interpreter's teardown (std::terminate), so a finished core leaves without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def cmd_trainer_satellite(args: argparse.Namespace) -> int:
    """Run a satellite trainer that joins the core's steps until told to leave (SIGTERM: after its micro-step)."""
    import signal

    from gyre.train.satellite import Satellite

    satellite = Satellite(args.core, args.name, args.threads or 0, args.backend, args.tensor_parallel,
                          args.pipeline_parallel)  # fmt: skip
    signal.signal(signal.SIGTERM, lambda *_: satellite.request_leave())
    try:
        while True:
            summary = satellite.run()
            print(f"gyre trainer satellite {summary.member}: {summary.micro_steps} micro-steps, "
                  f"{summary.tokens} tokens, joined in {summary.join_s:.3f} s", file=sys.stderr)  # fmt: skip
            if not args.stay:
                return 0
    finally:
        satellite.close()


def cmd_cell(args: argparse.Namespace) -> int:
    """Run one cell: its engine (and on the core cell the core trainer), switching roles on the controller's word."""
    from gyre.config import load_config
    from gyre.control.cellprocess import CellSpec, run_cell

    overrides = list(args.set or [])
    if args.host:
        overrides.append(override("cells.host", args.host))
    cfg = load_config(args.config, overrides)
    spec = CellSpec(name=args.name, kind=args.kind, order=args.order, controller=args.controller,
                    model_path=args.model or cfg.engine.model_path, log_dir=args.log_dir or "")  # fmt: skip
    if not spec.model_path:
        raise ConfigError("gyre cell needs a model: --model DIR or engine.model_path")
    run_cell(cfg, spec)
    # as the core trainer: gloo's pair objects abort the interpreter's teardown, so a finished cell leaves without it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def cmd_shard(args: argparse.Namespace) -> int:
    """Run one runtime shard: executions and a router for their sessions, on the driver's shard hub's word."""
    from gyre.config import load_config
    from gyre.runtime.shard import run_shard

    cfg = load_config(args.config, list(args.set or []))
    run_shard(cfg, args.name, args.hub, os.environ.get("GYRE_RAY_NODE", ""))
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The parsers of `gyre trainer`, `gyre shard`, `gyre cell`."""
    s = sub.add_parser("trainer", help="trainer processes: the core, and satellites that join its steps")
    trainer_sub = s.add_subparsers(dest="trainer_command", required=True)
    s = trainer_sub.add_parser(
        "core", help="the core trainer: weights, optimizer, the step's micro-step queue"
    )
    s.add_argument("--model", help="Hugging Face model directory to train (trainer.model_path)")
    s.add_argument("--bind", help="ZeroMQ address to listen at (default tcp://127.0.0.1:5570)")
    s.add_argument("--resume", help="checkpoint directory to continue from (trainer.resume_from)")
    s.add_argument("--threads", type=int, help="torch CPU threads")
    s.add_argument("--config", type=Path, help="TOML config file ([trainer] section)")
    s.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="dotted override, e.g. trainer.learning_rate=1e-4"
    )
    s.set_defaults(fn=cmd_trainer_core)
    s = trainer_sub.add_parser("satellite", help="a satellite trainer joining the core's steps")
    s.add_argument("--core", required=True, help="the core's address, tcp://HOST:PORT")
    s.add_argument("--name", help="member name (default: host, pid and a random suffix)")
    s.add_argument("--threads", type=int, help="torch CPU threads")
    s.add_argument("--stay", action="store_true", help="rejoin after being told to leave (until killed)")
    s.add_argument(
        "--backend", choices=["torch", "megatron"], default="torch", help="what computes its gradients"
    )
    s.add_argument(
        "--tensor-parallel", type=int, default=1, help="a Megatron satellite's tensor-parallel ranks"
    )
    s.add_argument("--pipeline-parallel", type=int, default=1, help="a Megatron satellite's pipeline stages")
    s.set_defaults(fn=cmd_trainer_satellite)

    s = sub.add_parser(
        "shard", help="one runtime shard: executions and their router, for a driver's shard hub"
    )
    s.add_argument("--hub", required=True, help="the driver's shard hub, tcp://HOST:PORT")
    s.add_argument("--name", required=True, help="the shard's name (shard-0 ...)")
    s.add_argument("--config", type=Path, help="the run's TOML config ([router], [sandbox], [shards])")
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help="dotted override")
    s.set_defaults(fn=cmd_shard)

    s = sub.add_parser(
        "cell", help="one cell: an engine and a trainer that serve or train on the controller's word"
    )
    s.add_argument("--controller", required=True, help="the controller's address, tcp://HOST:PORT")
    s.add_argument("--name", required=True, help="the cell's name (cell-0 ...)")
    s.add_argument("--kind", choices=["core", "satellite", "standalone"], default="satellite")
    s.add_argument("--order", type=int, default=1, help="place in the training order (0: the core)")
    s.add_argument("--model", help="Hugging Face model directory (engine.model_path)")
    s.add_argument("--log-dir", help="where the cell's engine writes its log")
    s.add_argument(
        "--host", help="this machine's address as the others reach it (cells.host; default 127.0.0.1)"
    )
    s.add_argument(
        "--config", type=Path, help="the run's TOML config ([cells], [controller], [trainer], [engine])"
    )
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help="dotted override")
    s.set_defaults(fn=cmd_cell)

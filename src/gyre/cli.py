"""The ``gyre`` command. Each subcommand lazy-imports what it needs, so ``gyre --help`` is instant."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gyre.errors import GyreError

if TYPE_CHECKING:
    from gyre.config import EngineConfig


def _engine_config(args: argparse.Namespace) -> EngineConfig:
    from gyre.config import load_config

    overrides = list(args.set or [])
    if args.model:
        overrides.append(f"engine.model_path={args.model!s}")
    if getattr(args, "port", None) is not None:
        overrides.append(f"engine.port={args.port}")
    if getattr(args, "threads", None) is not None:
        overrides.append(f"engine.num_threads={args.threads}")
    return load_config(args.config, overrides).engine


def cmd_init_model(args: argparse.Namespace) -> int:
    """Write a Hugging Face model directory from a preset."""
    from gyre.models import count_parameters, init_model

    path = init_model(args.dir, preset=args.preset, seed=args.seed, overwrite=args.overwrite)
    print(f"wrote {args.preset} model ({count_parameters(path):,} parameters) to {path}")
    return 0


def cmd_serve_engine(args: argparse.Namespace) -> int:
    """Serve the embedded engine over SGLang's HTTP API."""
    from gyre.engine.embedded.server import run_engine_server

    cfg = _engine_config(args)
    print(f"gyre engine: loading {cfg.model_path}; serving on http://{cfg.host}:{cfg.port}", file=sys.stderr)
    run_engine_server(cfg)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    """Send one chat generation to an engine (started here on --model when no --url is given)."""
    from gyre.engine.client import EngineClient
    from gyre.engine.launch import launch_embedded
    from gyre.models import load_tokenizer
    from gyre.protocol import SamplingParams

    tokenizer = load_tokenizer(args.model)
    messages = [{"role": "user", "content": args.prompt}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    input_ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p
    )

    async def run(url: str) -> None:
        async with EngineClient(url) as client:
            start = time.perf_counter()
            out = await client.generate(input_ids, params, return_logprob=True)
            elapsed = time.perf_counter() - start
        lps = out.output_logprobs
        print(
            f"prompt: {len(input_ids)} tokens; output: {len(out.output_ids)} tokens in {elapsed:.2f} s "
            f"({len(out.output_ids) / elapsed:.0f} tokens/s), finish {out.meta_info.finish_reason}, "
            f"weight version {out.meta_info.weight_version}"
        )
        print(f"mean logprob {sum(lps) / max(len(lps), 1):.3f}")
        print("text:", repr(out.text))

    if args.url:
        asyncio.run(run(args.url))
        return 0
    overrides = [f"engine.num_threads={args.threads}"] if args.threads else []
    with launch_embedded(args.model, overrides=overrides) as server:
        print(f"started the embedded engine at {server.url}")
        asyncio.run(run(server.url))
    return 0


def cmd_quickstart(args: argparse.Namespace) -> int:
    """The main job for now: make the tiny model if missing, serve it, send it a generation."""
    model = Path(args.model)
    if not (model / "config.json").exists():
        init = argparse.Namespace(dir=model, preset="tiny", seed=0, overwrite=False)
        cmd_init_model(init)
    gen = argparse.Namespace(
        model=str(model),
        url=None,
        prompt=args.prompt,
        max_new_tokens=64,
        temperature=1.0,
        top_p=1.0,
        threads=0,
    )
    return cmd_generate(gen)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    p = argparse.ArgumentParser(prog="gyre", description="Elastic online RL for long-horizon LLM agents.")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("init-model", help="write a Hugging Face model directory from a preset")
    s.add_argument("dir", type=Path)
    s.add_argument("--preset", default="tiny")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--overwrite", action="store_true")
    s.set_defaults(fn=cmd_init_model)

    s = sub.add_parser("serve-engine", help="serve the embedded engine (SGLang's HTTP API)")
    s.add_argument("--model", help="Hugging Face model directory")
    s.add_argument("--port", type=int)
    s.add_argument("--threads", type=int, help="torch CPU threads")
    s.add_argument("--config", type=Path, help="TOML config file ([engine] section)")
    s.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="dotted override, e.g. engine.kv_cache_mem_gib=2"
    )
    s.set_defaults(fn=cmd_serve_engine)

    s = sub.add_parser("generate", help="send one chat generation to an engine")
    s.add_argument(
        "--model", required=True, help="model directory (for the tokenizer, and to serve without --url)"
    )
    s.add_argument("--url", help="engine base URL; without it an embedded engine is started")
    s.add_argument("--prompt", default="Hello! Which tools do you have?")
    s.add_argument("--max-new-tokens", type=int, default=64)
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--threads", type=int, default=0)
    s.set_defaults(fn=cmd_generate)

    s = sub.add_parser("quickstart", help="init the tiny model if missing, serve it and send it a generation")
    s.add_argument("--model", default="models/tiny")
    s.add_argument("--prompt", default="Hello! Which tools do you have?")
    s.set_defaults(fn=cmd_quickstart)
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

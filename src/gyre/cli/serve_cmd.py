"""Serving by hand: `gyre serve-engine`, `gyre generate`, `gyre router` and `gyre session`."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gyre.cli.common import override, run_loop

if TYPE_CHECKING:
    from gyre.config import EngineConfig


def _engine_config(args: argparse.Namespace) -> EngineConfig:
    from gyre.config import load_config

    overrides = list(args.set or [])
    for key, value in (("model_path", args.model), ("port", getattr(args, "port", None)),
                       ("num_threads", getattr(args, "threads", None))):  # fmt: skip
        if value is not None and value != "":
            overrides.append(override(f"engine.{key}", value))
    return load_config(args.config, overrides).engine


def cmd_serve_engine(args: argparse.Namespace) -> int:
    """Serve the embedded engine over SGLang's HTTP API."""
    from gyre.engine.embedded.api import run_engine_server

    cfg = _engine_config(args)
    print(f"gyre engine: loading {cfg.model_path}; serving on http://{cfg.host}:{cfg.port}", file=sys.stderr)
    run_engine_server(cfg)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    """Send one chat generation to an engine (started here on --model when no --url is given)."""
    from gyre.engine.engineclient import EngineClient
    from gyre.engine.launcher import launch_embedded
    from gyre.engine.models import load_tokenizer
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


def cmd_router(args: argparse.Namespace) -> int:
    """Serve the OpenAI-compatible router in front of running engines."""
    from gyre.config import load_config
    from gyre.router.app import serve_router
    from gyre.router.routing import Router

    overrides = list(args.set or [])
    if args.engines:
        overrides.append(
            override("router.engines", [u.strip() for u in args.engines.split(",") if u.strip()])
        )
    for key, value in (("model_path", args.model), ("port", args.port), ("admin_port", args.admin_port),
                       ("journal_dir", args.journal)):  # fmt: skip
        if value is not None:
            overrides.append(override(f"router.{key}", value))
    cfg = load_config(args.config, overrides).router

    async def run() -> None:
        router = Router(cfg)
        from gyre.driver.eventloop import freeze_heap

        freeze_heap()  # the model's tokenizer and templates are permanent: keep them out of every collection
        print(
            f"gyre router: http://{cfg.host}:{cfg.port}/s/{{session}}/v1 for agents, "
            f"http://127.0.0.1:{cfg.admin_port}/admin for sessions and engines; "
            f"engines: {', '.join(cfg.engines) or 'none yet'}",
            file=sys.stderr,
        )
        await serve_router(router)

    run_loop(run())
    return 0


def cmd_session(args: argparse.Namespace) -> int:
    """Open a router session and print its OpenAI base URL (for an external scaffold)."""
    import httpx

    resp = httpx.post(args.admin.rstrip("/") + "/admin/sessions", json={"execution_id": args.execution_id})
    if resp.status_code != 200:
        print(f"gyre session: error: {resp.text}", file=sys.stderr)
        return 2
    data = resp.json()
    print(f"OPENAI_BASE_URL={data['base_url']}\nOPENAI_API_KEY={data['token']}")
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The parsers of `gyre serve-engine`, `gyre generate`, `gyre router`, `gyre session`."""
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

    s = sub.add_parser("router", help="serve the OpenAI-compatible router in front of engines")
    s.add_argument("--engines", help="comma-separated engine base URLs")
    s.add_argument("--model", help="the served model's directory (chat template, tokenizer)")
    s.add_argument("--port", type=int, help="agent-facing port (default 8000)")
    s.add_argument("--admin-port", type=int, help="admin port on 127.0.0.1 (default 8001)")
    s.add_argument("--journal", help="directory for calls.jsonl")
    s.add_argument("--config", type=Path, help="TOML config file ([router] section)")
    s.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="dotted override, e.g. router.retry_budget=3"
    )
    s.set_defaults(fn=cmd_router)

    s = sub.add_parser("session", help="open a router session; prints OPENAI_BASE_URL and OPENAI_API_KEY")
    s.add_argument("--admin", default="http://127.0.0.1:8001", help="the router's admin URL")
    s.add_argument("--execution-id", help="name the session's records carry")
    s.set_defaults(fn=cmd_session)

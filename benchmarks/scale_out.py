"""Runtime shards on one machine: what the driver pays per execution with the runtime in its own process and with
1, 2, 4 shards (each its own process), and the projection to 100,000 concurrent executions.

    python benchmarks/scale_out.py [--executions 120] [--shards 0,1,2,4] [--latency-s 0.5] [--calls 4]

Real parts throughout: the built-in agent on the toy suite's tasks, each execution in its own bubblewrap sandbox and
scored by the task's verifier, model calls through a real router to an engine stand-in in its own process
(`benchmarks/upstream.py`: canned tool calls, a run command or a submit, after a lognormal latency with median
``--latency-s``). With 0 shards the driver's own `Runtime` and `Router` run everything (what one `gyre train` driver
does today); with N shards the driver is a `ShardHub` sending each execution to the `gyre shard` process that owns
it, exactly as `gyre train` with ``[shards] count = N`` does. All executions are dispatched at once.

Measured per configuration: executions finished per second (dispatch to last result) and started per second (the
driver's sends, and the shards' own counters as reported), the driver's CPU per execution (its process: loop and
ZeroMQ's I/O thread) and the shards' (every child process: shards, sandboxes, verifiers), and the driver's loop
lag. Then the cost of carrying a finished execution's records back to the driver per token (msgpack, both ways), and
the model for 100,000 concurrent executions: shards needed, and the driver's share of one core (controller and
decisions from `benchmarks/sim_scale.py`'s measurements, the hub's per-execution cost from here). Writes
``benchmarks/results/scale_out.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from gyre.agents.toolagent import BuiltinAgentConfig
from gyre.config import GyreConfig, RouterConfig, SandboxConfig, ShardsConfig
from gyre.driver.eventloop import run as run_loop
from gyre.engine.launcher import free_port
from gyre.engine.models import init_model, load_tokenizer
from gyre.journal.records import CallRecord, CallTiming
from gyre.router.routing import Router
from gyre.runtime import BuiltinAgentSpec, ExecutionResult, ExecutionSpec, Runtime
from gyre.runtime.shard import RuntimeSpec, ShardMessage, ShardResult
from gyre.runtime.shards import ShardedRuntime, ShardHub
from gyre.tasks import resolve_suite

HERE = Path(__file__).parent
UPSTREAM = str(HERE / "upstream.py")
# sim_scale.py, 2026-12-03 (BENCHMARKS.md): what the single controller pays at 1,000 cells, share of one core
CONTROL_SHARE_1000_CELLS = 0.196  # heartbeats and pings, 49 us per message
DECIDE_S_1000_CELLS = 2.27e-3  # one decision's cost at 1,000 cells (linear in cells)
ROUTER_CALL_S = 0.362e-3  # the router's whole in-process chat call at turn 10 (benchmarks/router.py)


def cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def process_cpu(pid: int) -> float:
    """A process's CPU seconds and its waited-for children's (a shard's sandboxes and verifiers), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


async def lag_monitor(samples: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        await asyncio.sleep(0.02)
        samples.append(time.perf_counter() - start - 0.02)


async def measure(shards: int, specs: list[ExecutionSpec], model: Path, engine: str, tmp: Path,
                  progress: Progress) -> dict[str, Any]:  # fmt: skip
    """One configuration: every spec dispatched at once, on the driver's runtime (0) or ``shards`` shards."""
    run_dir = tmp / f"shards-{shards}"
    sandbox = SandboxConfig(workspace_root=str(tmp / "workspaces"))
    router_cfg = RouterConfig(model_path=str(model), engines=[] if shards else [engine])
    cfg = GyreConfig(router=router_cfg, sandbox=sandbox, shards=ShardsConfig(count=shards, report_s=0.5))
    bar = progress.add_task(f"{shards} shards" if shards else "in the driver", total=len(specs))
    lags: list[float] = []
    stop = asyncio.Event()
    hub: ShardHub | None = None
    router: Router | None = None
    if shards:
        hub = ShardHub(
            cfg, run_dir, {"run": RuntimeSpec(journal_dir=str(run_dir / "journal"), verifier_retries=0)}
        )
        await hub.__aenter__()
        hub.pool.add(engine, "upstream", managed=False)
        runner: Any = ShardedRuntime(hub, "run")
        await asyncio.sleep(1.0)  # the add reached every shard
    else:
        router = Router(router_cfg)
        runner = Runtime(router, sandbox, str(run_dir / "journal"))
    pids = [proc.pid for proc in hub.procs.values()] if hub is not None else []  # type: ignore[attr-defined]
    shards0 = sum(map(process_cpu, pids))  # their start-up (imports, tokenizer) is not the executions' cost
    driver0, children0, start = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
    monitor = asyncio.create_task(lag_monitor(lags, stop))
    results: list[ExecutionResult] = []
    started_by: list[float] = []

    async def one(spec: ExecutionSpec) -> None:
        started_by.append(time.perf_counter() - start)
        results.append(await runner.run_one(spec))
        progress.advance(bar)

    async with asyncio.TaskGroup() as group:
        for spec in specs:
            group.create_task(one(spec))
    wall = time.perf_counter() - start
    driver = cpu(resource.RUSAGE_SELF) - driver0
    stop.set()
    await monitor
    reported = hub.statistics().totals.started if hub is not None else len(results)
    children = (
        sum(map(process_cpu, pids)) - shards0
        if hub is not None
        else cpu(resource.RUSAGE_CHILDREN) - children0
    )
    if hub is not None:
        await hub.__aexit__(None, None, None)
    if router is not None:
        await runner.aclose()
        await router.aclose()
    n = len(results)
    calls = sum(len(r.records) for r in results)
    scored = sum(r.verdict is not None and r.verdict.outcome == "scored" for r in results)
    lags.sort()
    return {
        "shards": shards, "executions": n, "scored": scored, "calls_per_execution": calls / max(n, 1),
        "wall_s": wall, "finished_per_s": n / wall, "dispatched_per_s": n / max(max(started_by), 1e-6),
        "reported_started": reported, "driver_cpu_s": driver, "driver_ms_per_execution": 1000 * driver / n,
        "children_cpu_s": children,  # the shards and their sandboxes; in the driver: its sandboxes
        "children_ms_per_execution": 1000 * children / n,
        "loop_lag_p50_ms": 1000 * lags[len(lags) // 2] if lags else 0.0,
        "loop_lag_p99_ms": 1000 * lags[int(len(lags) * 0.99)] if lags else 0.0,
    }  # fmt: skip


def result_transfer(tokens: int, calls: int) -> float:
    """Seconds to encode (shard) and decode (driver) one finished execution's result with ``tokens`` sampled tokens
    over ``calls`` records, per token."""
    per = tokens // calls
    records = [CallRecord(call_id=f"c{i}", session="s", role="main", parent_call_id=f"c{i - 1}" if i else None,
                          prefix_len=per * i if i else 0, new_input_ids=list(range(40)), output_ids=list(range(per)),
                          output_logprobs=[-0.5] * per, finish_reason="stop", weight_version=3, cell="cell-1",
                          timing=CallTiming(submitted_s=0.0, first_token_s=0.1, finished_s=1.0))
               for i in range(calls)]  # fmt: skip
    result = ExecutionResult(execution_id="e1", task_id="t", group_index=0, status="done", agent=None, error=None,
                             records=records, prompt_tokens=40 * calls, completion_tokens=tokens, dispatched_s=0.0,
                             started_s=0.0, finished_s=1.0)  # fmt: skip
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(ShardMessage)
    message = ShardResult(shard="shard-0", job=1, result=result)
    rounds, start = 5, time.perf_counter()
    for _ in range(rounds):
        decoder.decode(encoder.encode(message))
    return (time.perf_counter() - start) / rounds / tokens


def project(
    rows: list[dict[str, Any]], transfer_s_per_token: float, args: argparse.Namespace
) -> dict[str, Any]:
    """100,000 concurrent executions, a model call every ``--turn-s`` each, lasting ``--duration-s``, on 1,000 cells."""
    sharded = [r for r in rows if r["shards"]]
    n, cells = args.target, 1000
    finishes = n / args.duration_s
    calls = n / args.turn_s
    hub_s = statistics.median(r["driver_ms_per_execution"] for r in sharded) / 1000
    # a shard's work: per call the router's in-process call; per execution what the toy's sandbox, agent and
    # verifier cost here beyond its calls (measured with 1 shard)
    one = next(r for r in sharded if r["shards"] == 1)
    fixed_s = max(one["children_ms_per_execution"] / 1000 - one["calls_per_execution"] * ROUTER_CALL_S, 0.0)
    shard_cores = calls * ROUTER_CALL_S + finishes * fixed_s
    shards_needed = math.ceil(shard_cores / args.shard_utilization)
    reports = shards_needed / 0.5 * 49e-6  # one report a shard each 0.5 s, at a control message's cost
    tokens = finishes * args.tokens_per_execution
    driver = {
        "controller (heartbeats, 1,000 cells)": CONTROL_SHARE_1000_CELLS,
        "decisions (one per finish, 2.27 ms at 1,000 cells)": min(finishes, 1 / DECIDE_S_1000_CELLS) * DECIDE_S_1000_CELLS,
        "hub: executions sent and results received": finishes * hub_s,
        "shard reports": reports,
        "records carried back (decode+encode per token)": tokens * transfer_s_per_token,
    }  # fmt: skip
    return {"executions": n, "cells": cells, "finishes_per_s": finishes, "calls_per_s": calls,
            "shard_cores": shard_cores, "shards_needed": shards_needed, "hub_ms_per_execution": hub_s * 1000,
            "shard_fixed_ms_per_execution": fixed_s * 1000, "driver_share": driver,
            "driver_total": sum(driver.values()), "tokens_per_s": tokens}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--executions", type=int, default=120)
    parser.add_argument("--shards", default="0,1,2,4", help="configurations; 0: the runtime in the driver")
    parser.add_argument(
        "--latency-s", type=float, default=0.5, help="median model-call latency of the stand-in"
    )
    parser.add_argument("--calls", type=int, default=4, help="the agent's most calls per execution")
    parser.add_argument("--target", type=int, default=100_000, help="concurrent executions to project to")
    parser.add_argument("--turn-s", type=float, default=10.0, help="projection: a model call every this long")
    parser.add_argument("--duration-s", type=float, default=1800.0, help="projection: one execution's length")
    parser.add_argument("--tokens-per-execution", type=int, default=20_000,
                        help="projection: sampled tokens a finished execution carries back")  # fmt: skip
    parser.add_argument(
        "--shard-utilization", type=float, default=0.5, help="projection: a shard's core, at most"
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "scale_out.json")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    console = Console(width=150)
    tmp = Path(tempfile.mkdtemp(prefix="gyre-scale-out-"))
    model = init_model(tmp / "tiny")
    tok = load_tokenizer(model)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    replies = ['<tool_call>\n{"name": "bash", "arguments": {"command": "echo working"}}\n</tool_call>',
               '<tool_call>\n{"name": "submit", "arguments": {"answer": "done"}}\n</tool_call>']  # fmt: skip
    ids = [tok.encode(r, add_special_tokens=False) + [eos] for r in replies]
    port = free_port()
    upstream = subprocess.Popen([sys.executable, UPSTREAM, str(port), str(args.latency_s), json.dumps(ids)])
    engine = f"http://127.0.0.1:{port}"
    tasks = resolve_suite("toy")
    agent = BuiltinAgentSpec(config=BuiltinAgentConfig(max_steps=args.calls, max_tokens_per_call=64))
    rows: list[dict[str, Any]] = []
    try:
        time.sleep(1.0)
        for shards in [int(x) for x in args.shards.split(",")]:
            specs = [ExecutionSpec(task=tasks[i % len(tasks)], group_index=i, agent=agent,
                                   execution_id=f"e{i:06d}.0/{tasks[i % len(tasks)].id}/{i}")
                     for i in range(args.executions)]  # fmt: skip
            with Progress(console=console) as progress:
                rows.append(run_loop(measure(shards, specs, model, engine, tmp, progress)))
    finally:
        upstream.kill()
        upstream.wait()
    transfer = result_transfer(20_000, 200)
    projection = project(rows, transfer, args) if any(r["shards"] == 1 for r in rows) else {}

    table = Table(title=f"{args.executions} executions at once (toy tasks, built-in agent, bubblewrap, verifier; "
                        f"model latency median {args.latency_s:g} s), this 2-core machine")  # fmt: skip
    for column in ("runtime", "scored", "calls/exec", "wall", "finished/s", "driver CPU/exec",
                   "shards' CPU/exec (sandboxes in)", "sandboxes' CPU/exec", "driver lag p50/p99"):  # fmt: skip
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row("in the driver" if not r["shards"] else f"{r['shards']} shards", f"{r['scored']}/{r['executions']}",
                      f"{r['calls_per_execution']:.1f}", f"{r['wall_s']:.1f} s", f"{r['finished_per_s']:.1f}",
                      f"{r['driver_ms_per_execution']:.1f} ms",
                      f"{r['children_ms_per_execution']:.1f} ms" if r["shards"] else "-",
                      f"{r['children_ms_per_execution']:.1f} ms" if not r["shards"] else "(in shards)",
                      f"{r['loop_lag_p50_ms']:.1f} / {r['loop_lag_p99_ms']:.1f} ms")  # fmt: skip
    console.print(table)
    base = next((r for r in rows if not r["shards"]), None)
    if base:
        for r in rows:
            if r["shards"]:
                console.print(f"{r['shards']} shards: the driver pays {r['driver_ms_per_execution'] / base['driver_ms_per_execution']:.2f}x "
                              f"its in-process CPU per execution; throughput {r['finished_per_s'] / base['finished_per_s']:.2f}x")  # fmt: skip
    console.print(
        f"records carried back to the driver: {transfer * 1e9:.0f} ns per sampled token (encode + decode)"
    )
    if projection:
        p = projection
        console.print(f"\n[bold]{p['executions']:,} concurrent executions[/bold], a call every {args.turn_s:g} s each, "
                      f"{args.duration_s / 60:g}-minute executions: {p['calls_per_s']:,.0f} calls/s, "
                      f"{p['finishes_per_s']:.1f} finishes/s")  # fmt: skip
        console.print(f"shards: {p['shard_cores']:.1f} cores of router and runtime work -> {p['shards_needed']} shards "
                      f"at {args.shard_utilization:.0%} of a core each")  # fmt: skip
        for part, share in p["driver_share"].items():
            console.print(f"  driver, {part}: {share:.1%} of a core")
        console.print(
            f"  driver in all: {p['driver_total']:.1%} of a core (one process; every other part replicated)"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "transfer_s_per_token": transfer, "projection": projection,
                                    "args": {k: str(v) for k, v in vars(args).items()}}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()

"""Thousands of concurrent executions in one event loop: loop lag, driver memory, sandbox command overhead.

    python benchmarks/runtime.py [--executions 1000,5000,10000] [--latency-s 8]

Each execution is the built-in agent on a trivial task in its own bubblewrap sandbox, talking through the in-process
router to an upstream (its own process) that answers every model call after a realistic, heavy-tailed latency
(lognormal, median ``--latency-s``) with a scripted reply: run a command (half the time) or submit. While a burst
runs, a monitor measures the event loop's lag (how late a 20 ms sleep wakes up) and counts the garbage collector's
full collections; driver memory per execution is the resident-set growth at the burst's peak divided by the
burst's executions, and by those running (started, not finished) at that moment. Side by side in the same run: the
time of ``true`` through a sandbox's command server, in a bubblewrap of its own, and as a plain subprocess. The
driver's loop and collector are those of ``gyre train`` (`gyre.driver.eventloop`: uvloop, `Governor`); ``--loop asyncio`` and
``--gc plain`` compare. Writes ``benchmarks/results/runtime.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import uvloop
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from gyre.agents.toolagent import BuiltinAgentConfig
from gyre.config import RouterConfig, SandboxConfig
from gyre.driver.eventloop import Governor, freeze_heap
from gyre.engine.launcher import free_port
from gyre.engine.models import init_model, load_tokenizer
from gyre.router.routing import Router
from gyre.runtime import BuiltinAgentSpec, ExecutionSpec, Runtime
from gyre.sandbox import make_sandbox
from gyre.sandbox.process import spawn
from gyre.tasks import Task

UPSTREAM = str(Path(__file__).with_name("upstream.py"))  # the engine stand-in, run as its own process


def rss_mib() -> float:
    """Resident set size of this process."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def burst(runtime: Runtime, n: int, progress: Progress) -> dict[str, float]:
    """Run ``n`` executions at once; measure loop lag and memory while they wait."""
    task = Task(id="bench", instruction="Run one command, then submit.", time_budget_s=600)
    specs = [ExecutionSpec(task=task, group_index=i, agent=BuiltinAgentSpec(config=BuiltinAgentConfig(max_steps=8)))
             for i in range(n)]  # fmt: skip
    lags: list[float] = []
    pauses: list[tuple[int, float]] = []  # (generation, seconds) of every collection during the burst
    began = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - began[0]))

    gc.callbacks.append(on_gc)
    peak = base = rss_mib()
    running_at_peak = 0  # executions started and not finished when the resident set peaked
    done = asyncio.Event()

    async def monitor() -> None:
        nonlocal peak, running_at_peak
        while not done.is_set():
            start = time.perf_counter()
            await asyncio.sleep(0.02)
            lags.append(time.perf_counter() - start - 0.02)
            rss = rss_mib()
            if rss > peak:
                peak, running_at_peak = rss, runtime.statistics().running

    bar = progress.add_task(f"{n:,} executions", total=n)

    async def watch() -> None:
        while not done.is_set():
            progress.update(bar, completed=runtime.statistics().finished)
            await asyncio.sleep(0.5)

    runtime.new_burst()
    start = time.perf_counter()
    watcher = asyncio.gather(monitor(), watch())
    results = await runtime.run(specs)
    elapsed = time.perf_counter() - start
    done.set()
    await watcher
    gc.callbacks.remove(on_gc)
    full = [seconds for generation, seconds in pauses if generation == 2]
    progress.update(bar, completed=n)
    statuses = {s: sum(r.status == s for r in results) for s in {r.status for r in results}}
    lags.sort()
    return {
        "executions": n,
        "wall_s": elapsed,
        "lag_p50_ms": lags[len(lags) // 2] * 1e3,
        "lag_p99_ms": lags[int(len(lags) * 0.99)] * 1e3,
        "lag_max_ms": lags[-1] * 1e3,
        "gc_full": len(full),
        "gc_full_max_ms": max(full, default=0.0) * 1e3,
        "gc_total_s": sum(seconds for _, seconds in pauses),
        "peak_rss_mib": peak,
        "kib_per_execution": (peak - base) * 1024 / n,
        "running_at_peak": running_at_peak,
        "kib_per_running": (peak - base) * 1024 / max(running_at_peak, 1),
        "calls": sum(len(r.records) for r in results),
        "statuses": statuses,  # type: ignore[dict-item]
    }


async def command_overhead(cfg: SandboxConfig, runs: int) -> dict[str, float]:
    """Median seconds of `true`: through the sandbox's command server, in a bubblewrap of its own (the
    per-command mode), and as a plain subprocess, alternating."""
    times: dict[str, list[float]] = {"server": [], "per_command": [], "plain": []}
    per_command = msgspec.structs.replace(cfg, command_server=False)
    async with make_sandbox(cfg) as server, make_sandbox(per_command) as own:
        await server.exec("true")  # the server starts with the first command
        for _ in range(runs):
            for name, sandbox in (("server", server), ("per_command", own)):
                start = time.perf_counter()
                await sandbox.exec("true")
                times[name].append(time.perf_counter() - start)
            start = time.perf_counter()
            await (await spawn(["/bin/true"], env={}, cwd=None, stdin=None, stdout=None, stderr=None)).wait()
            times["plain"].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--executions", default="1000,5000,10000")
    parser.add_argument("--latency-s", type=float, default=8.0, help="median model-call latency")
    parser.add_argument("--overhead-runs", type=int, default=200, help="runs of `true` in each mode")
    parser.add_argument(
        "--loop",
        choices=["uvloop", "asyncio"],
        default="uvloop",
        help="the driver's loop (gyre train runs uvloop)",
    )
    parser.add_argument(
        "--gc",
        choices=["governor", "plain"],
        default="governor",
        help="the collector as the drivers run it (gyre.driver.eventloop.Governor), or Python's own",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=SandboxConfig().nice,
        help="sandbox.nice: how far below the driver sandboxes run",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "runtime.json")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a socket per waiting model call
    console = Console()
    tmp = Path(tempfile.mkdtemp())
    model = init_model(tmp / "tiny")
    tok = load_tokenizer(model)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    replies = [
        '<tool_call>\n{"name": "bash", "arguments": {"command": "echo working"}}\n</tool_call>',
        '<tool_call>\n{"name": "submit", "arguments": {"answer": "done"}}\n</tool_call>',
    ]
    ids = [tok.encode(r, add_special_tokens=False) + [eos] for r in replies]
    port = free_port()
    upstream = subprocess.Popen([sys.executable, UPSTREAM, str(port), str(args.latency_s), json.dumps(ids)])
    sandbox_cfg = SandboxConfig(workspace_root=str(tmp / "workspaces"), nice=args.nice)
    rows = []
    try:
        time.sleep(1.0)

        async def run_all() -> dict[str, float]:
            router = Router(RouterConfig(model_path=str(model), engines=[f"http://127.0.0.1:{port}"]))
            runtime = Runtime(router, sandbox_cfg)
            freeze_heap()  # as the drivers do (gyre.driver.eventloop)
            if args.gc == "governor":
                Governor().install()
            overhead = await command_overhead(sandbox_cfg, args.overhead_runs)
            with Progress(console=console) as progress:
                for n in [int(x) for x in args.executions.split(",") if x.strip()]:
                    rows.append(await burst(runtime, n, progress))
            await router.aclose()
            return overhead

        # the driver's loop, as `gyre train` and `gyre eval` run it, or the standard library's for comparison
        overhead = uvloop.run(run_all()) if args.loop == "uvloop" else asyncio.run(run_all())
    finally:
        upstream.kill()
    table = Table(
        title=f"Concurrent executions in one {args.loop} event loop, gc {args.gc}, sandboxes at nice {args.nice} "
        f"(model latency median {args.latency_s:g} s)"
    )
    for col in (
        "executions",
        "wall",
        "loop lag p50",
        "loop lag p99",
        "loop lag max",
        "full GCs (longest)",
        "driver KiB / execution",
        "running at peak (KiB each)",
        "model calls",
        "ended",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r['executions']:,}", f"{r['wall_s']:.0f} s", f"{r['lag_p50_ms']:.1f} ms",
                      f"{r['lag_p99_ms']:.1f} ms", f"{r['lag_max_ms']:.0f} ms",
                      f"{r['gc_full']} ({r['gc_full_max_ms']:.0f} ms)", f"{r['kib_per_execution']:.0f}",
                      f"{r['running_at_peak']:,} ({r['kib_per_running']:.0f})", f"{r['calls']:,}",
                      ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items())))  # fmt: skip
    console.print(table)
    over = Table(title=f"Command overhead: `true` (median of {args.overhead_runs}, alternating)")
    for col in (
        "command server",
        "bubblewrap per command",
        "plain subprocess",
        "added: server",
        "added: per command",
    ):
        over.add_column(col, justify="right")
    ms = {name: value * 1e3 for name, value in overhead.items()}
    over.add_row(
        f"{ms['server']:.2f} ms", f"{ms['per_command']:.2f} ms", f"{ms['plain']:.2f} ms",
        f"{ms['server'] - ms['plain']:.2f} ms", f"{ms['per_command'] - ms['plain']:.2f} ms",
    )  # fmt: skip
    console.print(over)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"bursts": rows, "true_s": overhead}, indent=2))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Router overhead against a minimal upstream: requests/s and added latency, through the router vs direct.

    python benchmarks/router.py [--requests 3000] [--concurrency 1,64,256] [--no-turns]

The upstream is a bare asyncio HTTP server that answers ``/generate`` at once with a fixed 16-token reply, in its
own process; the router (``gyre router``) runs in another process pinned to one core; the load generator (raw
keep-alive HTTP/1.1 over asyncio streams, so it adds as little as possible) sends requests straight to the
upstream's ``/generate`` and chat requests through the router (one session per connection, every question different,
so nothing is served from a cache), side by side in one run. Each row opens its connections, then all of them send
at once. Added latency is the router path's percentile minus the direct path's; ``p99 / p50`` is the router path's
spread (a connection that waits several rounds shows there; the target is at most 4x at 256 concurrent). A second
table gives the router's own time per chat call at turns 10, 100 and 500 of one conversation (in-process, engine
answered at once): with token-exact extension only the new messages are rendered. Writes
``benchmarks/results/router.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from gyre.config import RouterConfig
from gyre.engine.launcher import ServerProcess, free_port
from gyre.engine.models import init_model
from gyre.router.openai_types import ChatRequest
from gyre.router.pool import EnginePool, Generation
from gyre.router.routing import Router

UPSTREAM = str(Path(__file__).with_name("upstream.py"))  # the engine stand-in, run as its own process


class Connection:
    """One keep-alive HTTP/1.1 connection that sends a prepared POST and reads the response."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def post(self, request: bytes) -> int:
        self.writer.write(request)
        header = await self.reader.readuntil(b"\r\n\r\n")
        status = int(header[9:12])
        length = 0
        for line in header.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await self.reader.readexactly(length)
        return status


def _request(path: str, body: dict[str, object], extra: str = "") -> bytes:
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n{extra}\r\n"
    return head.encode() + data


async def load(port: int, requests: list[list[bytes]], total: int) -> tuple[float, list[float]]:
    """Send ``total`` requests, connection ``i`` sending ``requests[i]`` in turn; return requests/s and latencies."""
    conns = [await Connection.open(port) for _ in requests]
    latencies: list[float] = []
    left = total

    async def worker(conn: Connection, mine: list[bytes]) -> None:
        nonlocal left
        n = 0
        while left > 0:
            left -= 1
            start = time.perf_counter()
            status = await conn.post(mine[n % len(mine)])
            latencies.append(time.perf_counter() - start)
            assert status == 200, status
            n += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(c, mine) for c, mine in zip(conns, requests, strict=True)))
    elapsed = time.perf_counter() - start
    for c in conns:
        c.writer.close()
    return total / elapsed, latencies


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _InstantPool(EnginePool):
    """An engine pool that answers every call at once with a fixed 16-token reply (no engine, no network)."""

    async def generate(self, input_ids, params, affinity=None, top_logprobs_num=0, control=None):  # type: ignore[no-untyped-def]
        ids = list(range(100, 115)) + [258]
        return Generation(
            ids,
            [-0.5] * 16,
            [],
            {"type": "stop", "matched": 258},
            0,
            "e",
            ["e"],
            time.time(),
            [0] * 16,
            "policy",
        )


def turn_costs(model: Path, turns: list[int]) -> dict[str, dict[int, float]]:
    """Median router time (ms) per chat call at turns of one long conversation, engine time excluded.

    ``render``: matching the earlier call and rendering the new messages (``Router._prepare_chat``);
    ``call``: the whole in-process call, which also builds the full input ids and the record.
    """
    # no engine bounds the conversation here: past the tiny model's context the router would refuse it (413)
    router = Router(RouterConfig(model_path=str(model), context_length=1 << 24), pool=_InstantPool())
    token = router.open_session()
    messages: list[dict[str, object]] = [{"role": "system", "content": "You are a coding agent. " * 20}]
    samples: dict[str, dict[int, list[float]]] = {
        "render": {t: [] for t in turns},
        "call": {t: [] for t in turns},
    }
    prepare = router._prepare_chat
    spent: list[float] = []

    async def timed_prepare(*args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        try:
            return await prepare(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    router._prepare_chat = timed_prepare  # type: ignore[method-assign]

    async def run() -> None:
        for turn in range(1, max(turns) + 1):
            messages.append({"role": "user", "content": f"Tool output of step {turn}: " + "x = 1\n" * 40})
            req = ChatRequest(model="tiny", messages=list(messages))
            start = time.perf_counter()
            body = await router.chat(token, req)
            elapsed = time.perf_counter() - start
            for t in turns:
                if t - 2 <= turn <= t + 2:  # five samples around each reported turn
                    samples["call"][t].append(elapsed)
                    samples["render"][t].append(spent[-1])
            messages.append(body["choices"][0]["message"])

    asyncio.run(run())
    assert all(r.parent_call_id for r in router.records(token)[1:])  # every turn extended the previous one
    return {k: {t: statistics.median(v) * 1e3 for t, v in per.items()} for k, per in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", default="1,64,256")
    parser.add_argument("--router-cpu", type=int, default=0, help="the core the router is pinned to")
    parser.add_argument("--no-turns", action="store_true", help="skip the per-turn cost table")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "router.json")
    args = parser.parse_args()
    console = Console(width=130)
    tmp = Path(tempfile.mkdtemp())
    model = init_model(tmp / "tiny")
    up_port, port, admin_port = free_port(), free_port(), free_port()
    upstream = subprocess.Popen(
        [sys.executable, UPSTREAM, str(up_port), "0", json.dumps([[*range(100, 115), 258]])]
    )
    cmd = [
        sys.executable,
        "-m",
        "gyre",
        "router",
        "--model",
        str(model),
        "--engines",
        f"http://127.0.0.1:{up_port}",
    ]
    cmd += ["--port", str(port), "--admin-port", str(admin_port)]
    if hasattr(os, "sched_setaffinity"):
        cmd = ["taskset", "-c", str(args.router_cpu), *cmd]
        os.sched_setaffinity(0, {c for c in os.sched_getaffinity(0) if c != args.router_cpu} or {0})
    router = ServerProcess(cmd, port, tmp / "router.log").wait_ready(60)
    try:
        admin = f"http://127.0.0.1:{admin_port}/admin/sessions"

        def chats(c: int, total: int) -> list[list[bytes]]:
            """One session per connection (an execution each), every request a different question."""
            per = -(-total // c)
            out = []
            for i in range(c):
                token = httpx.post(admin, json={"execution_id": f"bench-{c}-{i}"}).json()["token"]
                out.append([
                    _request(f"/s/{token}/v1/chat/completions", {
                        "model": "tiny", "max_tokens": 16,
                        "messages": [{"role": "user", "content": f"What is {i} + {k}? Answer briefly."}],
                    })
                    for k in range(per)
                ])  # fmt: skip
            return out

        prompt = list(range(20))
        direct = _request(
            "/generate",
            {"input_ids": prompt, "sampling_params": {"max_new_tokens": 16}, "return_logprob": True},
        )
        asyncio.run(load(port, chats(8, 200), 200))  # warm-up
        rows = []
        for c in [int(x) for x in args.concurrency.split(",")]:
            total = max(args.requests, 4 * c)
            d_rps, d_lat = asyncio.run(load(up_port, [[direct]] * c, total))
            r_rps, r_lat = asyncio.run(load(port, chats(c, total), total))
            rows.append({
                "concurrency": c, "direct_rps": d_rps, "router_rps": r_rps,
                "direct_p50_ms": pct(d_lat, 0.5) * 1e3, "router_p50_ms": pct(r_lat, 0.5) * 1e3,
                "direct_p99_ms": pct(d_lat, 0.99) * 1e3, "router_p99_ms": pct(r_lat, 0.99) * 1e3,
                "router_mean_ms": statistics.mean(r_lat) * 1e3,
            })  # fmt: skip
    finally:
        router.stop()
        upstream.kill()
    table = Table(title="Router vs direct to a minimal upstream (router pinned to one core)")
    for col in (
        "concurrent",
        "direct req/s",
        "router req/s",
        "added p50",
        "added p99",
        "router p50",
        "router p99",
        "p99 / p50",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["concurrency"]), f"{r['direct_rps']:,.0f}", f"{r['router_rps']:,.0f}",
            f"{r['router_p50_ms'] - r['direct_p50_ms']:.2f} ms", f"{r['router_p99_ms'] - r['direct_p99_ms']:.2f} ms",
            f"{r['router_p50_ms']:.2f} ms", f"{r['router_p99_ms']:.2f} ms",
            f"{r['router_p99_ms'] / r['router_p50_ms']:.1f}x",
        )  # fmt: skip
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.no_turns:
        args.out.write_text(json.dumps({"throughput": rows}, indent=2))
        console.print(f"wrote {args.out}")
        return
    costs = turn_costs(model, [10, 100, 500])
    turns = Table(
        title="Router time per chat call along one conversation (engine excluded, median of 5 turns)"
    )
    for col in ("", "turn 10", "turn 100", "turn 500", "500 / 10"):
        turns.add_column(col, justify="right")
    for kind, c in costs.items():
        turns.add_row(kind, *(f"{c[t]:.2f} ms" for t in (10, 100, 500)), f"{c[500] / c[10]:.2f}x")
    console.print(turns)
    args.out.write_text(json.dumps({"throughput": rows, "turn_cost_ms": costs}, indent=2))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

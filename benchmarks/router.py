"""Router overhead against a minimal upstream: requests/s and added latency, through the router vs direct.

    python benchmarks/router.py [--requests 3000] [--concurrency 1,64,256]

The upstream is a bare asyncio HTTP server that answers ``/generate`` at once with a fixed 16-token reply, in its
own process; the router (``gyre router``) runs in another process pinned to one core; the load generator (raw
keep-alive HTTP/1.1 over asyncio streams, so it adds as little as possible) sends requests straight to the
upstream's ``/generate`` and chat requests through the router (one session per connection, every question different,
so nothing is served from a cache), side by side in one run. Added
latency is the router path's percentile minus the direct path's. Writes ``benchmarks/results/router.json``.
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

from gyre.engine.launch import ServerProcess, free_port
from gyre.models import init_model

UPSTREAM = r"""
import asyncio, json, sys
ids = list(range(100, 115)) + [258]
meta = {"id": "x", "finish_reason": {"type": "stop", "matched": 258}, "prompt_tokens": 20, "completion_tokens": 16,
        "weight_version": "0", "output_token_logprobs": [[-0.5, t, None] for t in ids]}
body = json.dumps({"text": "", "output_ids": ids, "meta_info": meta}).encode()
head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
async def handle(reader, writer):
    try:
        while True:
            header = await reader.readuntil(b"\r\n\r\n")
            n = 0
            for line in header.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    n = int(line.split(b":")[1])
            if n:
                await reader.readexactly(n)
            writer.write(head + body if not header.startswith(b"GET") else b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    await server.serve_forever()
asyncio.run(main())
"""


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", default="1,64,256")
    parser.add_argument("--router-cpu", type=int, default=0, help="the core the router is pinned to")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "router.json")
    args = parser.parse_args()
    console = Console()
    tmp = Path(tempfile.mkdtemp())
    model = init_model(tmp / "tiny")
    up_port, port, admin_port = free_port(), free_port(), free_port()
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(up_port)])
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
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["concurrency"]), f"{r['direct_rps']:,.0f}", f"{r['router_rps']:,.0f}",
            f"{r['router_p50_ms'] - r['direct_p50_ms']:.2f} ms", f"{r['router_p99_ms'] - r['direct_p99_ms']:.2f} ms",
            f"{r['router_p50_ms']:.2f} ms", f"{r['router_p99_ms']:.2f} ms",
        )  # fmt: skip
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

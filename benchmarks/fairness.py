"""Fairness between sessions: neighbours' call latency with and without one session flooding the router (issue 48).

    python benchmarks/fairness.py [--neighbours 8] [--flood 64] [--seconds 30] [--rounds 6] [--limits 0,2]

The embedded engine on a fresh tiny model and ``gyre router`` in front of it, each its own process. Neighbours:
``--neighbours`` sessions in this process, each making ordinary calls, one at a time (8 tokens, a different
question every call, ``--think-s`` between calls as an agent runs its tool). The flood, in a process of its own:
one session with ``--flood`` keep-alive connections, each calling back to back with no pause (what a sandbox that
floods its own router socket sends). For each router setting (one session's calls running at once: unlimited,
today's behaviour before issue 48, and each of ``--limits``), the neighbours run alone, then beside the flood, on the same
router and engine, in turns (``--rounds``, every setting in each round); the table gives their p50 and p99 side by side and the flooded-over-alone ratio (target: p50
within 1.5x with the limit), and the flood's own throughput. Writes ``benchmarks/results/fairness.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from gyre.engine.launcher import launch_embedded
from gyre.engine.models import init_model
from gyre.router.spawn import launch_router

UNLIMITED = 1_000_000  # router.max_calls_per_session that never binds


class Connection:
    """One keep-alive HTTP/1.1 connection posting chat calls for one session (raw: the client adds little)."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token

    async def open(self) -> Connection:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    async def chat(self, question: str) -> None:
        body = json.dumps({"model": "default", "max_tokens": 8, "temperature": 0,
                           "messages": [{"role": "user", "content": question}]}).encode()  # fmt: skip
        head = f"POST /s/{self.token}/v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        self.writer.write(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
        header = await self.reader.readuntil(b"\r\n\r\n")
        if not header.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(header.decode(errors="replace"))
        length = next(
            int(h.split(b":")[1]) for h in header.split(b"\r\n") if h.lower().startswith(b"content-length")
        )
        await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


async def neighbours(port: int, tokens: list[str], seconds: float, think_s: float) -> list[float]:
    """Each session calls, one at a time, for ``seconds``; every call's latency."""
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def one(i: int, token: str) -> None:
        conn = await Connection(port, token).open()
        n = 0
        await asyncio.sleep(think_s * i / len(tokens))  # staggered, as executions are
        while time.monotonic() < deadline:
            started = time.perf_counter()
            await conn.chat(f"neighbour {i}, question {n}: what next?")
            latencies.append(time.perf_counter() - started)
            n += 1
            await asyncio.sleep(think_s)
        conn.close()

    await asyncio.gather(*(one(i, t) for i, t in enumerate(tokens)))
    return latencies


def flood(port: int, token: str, connections: int, go: Any, idle: Any, stop: Any, out: Any) -> None:
    """(a process of its own) While ``go`` is set, ``connections`` connections of one session call back to back;
    ``idle`` is set while none of them has a call in flight. Puts its calls to ``out`` once ``stop`` is set."""

    async def main() -> int:
        calls, busy = 0, 0
        conns = [await Connection(port, token).open() for _ in range(connections)]
        running = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                await asyncio.to_thread(go.wait, 0.2)
                if go.is_set():
                    running.set()
                else:
                    running.clear()
                    if not busy:
                        idle.set()

        async def one(conn: Connection, i: int) -> None:
            nonlocal calls, busy
            while not stop.is_set():
                await running.wait()
                busy += 1
                idle.clear()
                await conn.chat(f"flood {i}, call {calls}")
                busy -= 1
                calls += 1

        watcher = asyncio.ensure_future(watch())
        tasks = [asyncio.ensure_future(one(c, i)) for i, c in enumerate(conns)]
        await watcher
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return calls

    out.put(asyncio.run(main()))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Setting:
    """A router with one ``max_calls_per_session``, its neighbour sessions, and a flood process paused between
    phases; what its neighbours measured, alone and flooded."""

    def __init__(self, args: argparse.Namespace, model: Path, engine_url: str, per_session: int, tmp: Path):
        self.args, self.per_session = args, per_session
        self.proc, admin = launch_router(model, [engine_url], log_path=tmp / f"router-{per_session}.log",
                                         overrides=[f"router.max_calls_per_session={per_session}"])  # fmt: skip
        with httpx.Client() as http:
            tokens = [http.post(f"{admin}/admin/sessions", json={"execution_id": name}).json()["token"]
                      for name in [*(f"neighbour-{i}" for i in range(args.neighbours)), "flood"]]  # fmt: skip
        self.tokens = tokens[:-1]
        asyncio.run(neighbours(self.proc.port, self.tokens, 2.0, args.think_s))  # warm-up
        ctx = multiprocessing.get_context("spawn")
        self.go, self.idle, self.stop, self.out = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
        flood_args = (self.proc.port, tokens[-1], args.flood, self.go, self.idle, self.stop, self.out)
        self.flooder = ctx.Process(target=flood, args=flood_args)
        self.flooder.start()
        self.alone: list[float] = []
        self.flooded: list[float] = []
        self.flood_s = 0.0

    def round(self, phase_s: float) -> None:
        """The neighbours alone for ``phase_s``, then beside the flood as long."""
        self.idle.wait(120)  # the flood's calls have all been answered
        self.alone += asyncio.run(neighbours(self.proc.port, self.tokens, phase_s, self.args.think_s))
        self.go.set()
        began = time.monotonic()
        self.flooded += asyncio.run(neighbours(self.proc.port, self.tokens, phase_s, self.args.think_s))
        self.go.clear()
        self.flood_s += time.monotonic() - began

    def close(self) -> dict[str, Any]:
        """Stop the flood and the router; the figures."""
        self.stop.set()
        flood_calls = self.out.get(timeout=120)
        self.flooder.join(30)
        self.proc.stop()
        alone, flooded = self.alone, self.flooded
        return {
            "max_calls_per_session": self.per_session,
            "alone_calls": len(alone), "alone_p50_s": pct(alone, 0.5), "alone_p99_s": pct(alone, 0.99),
            "flooded_calls": len(flooded), "flooded_p50_s": pct(flooded, 0.5), "flooded_p99_s": pct(flooded, 0.99),
            "flood_calls_per_s": flood_calls / self.flood_s,
        }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--neighbours", type=int, default=8)
    parser.add_argument("--flood", type=int, default=64, help="the flooding session's connections")
    parser.add_argument("--seconds", type=float, default=30.0, help="alone, and flooded, in all")
    parser.add_argument("--rounds", type=int, default=6, help="alone and flooded in turn, this many times")
    parser.add_argument("--think-s", type=float, default=0.1, help="a neighbour's pause between calls")
    parser.add_argument("--limits", default="0,2", help="each router's max_calls_per_session (0: unlimited)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fairness.json")
    args = parser.parse_args()
    console = Console(width=130)
    tmp = Path(tempfile.mkdtemp(prefix="gyre-fairness-"))
    try:
        model = init_model(tmp / "tiny", preset="tiny", seed=0)
        with launch_embedded(
            model, overrides=["engine.kv_cache_mem_gib=0.2"], log_path=tmp / "engine.log"
        ) as engine:
            limits = [int(x) or UNLIMITED for x in args.limits.split(",")]
            settings: list[Setting] = []
            try:
                settings += [Setting(args, model, engine.url, limit, tmp) for limit in limits]
                # every setting alone and flooded in turn, round after round, so that the machine's other load
                # falls on all of them alike
                for _ in range(args.rounds):
                    for setting in settings:
                        setting.round(args.seconds / args.rounds)
                rows = [setting.close() for setting in settings]
            finally:
                for setting in settings:
                    setting.flooder.kill()
                    setting.proc.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    table = Table(title=f"{args.neighbours} neighbours' calls, alone and beside one session flooding on "
                  f"{args.flood} connections (tiny model, embedded engine; {args.seconds:g} s each, in {args.rounds} turns)")  # fmt: skip
    for column in ("calls per session", "alone p50", "flooded p50", "p50 ratio", "alone p99", "flooded p99",
                   "p99 ratio", "flood calls/s"):  # fmt: skip
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            "unlimited" if r["max_calls_per_session"] == UNLIMITED else str(r["max_calls_per_session"]),
            f"{r['alone_p50_s'] * 1e3:.1f} ms", f"{r['flooded_p50_s'] * 1e3:.1f} ms",
            f"{r['flooded_p50_s'] / r['alone_p50_s']:.2f}x",
            f"{r['alone_p99_s'] * 1e3:.1f} ms", f"{r['flooded_p99_s'] * 1e3:.1f} ms",
            f"{r['flooded_p99_s'] / r['alone_p99_s']:.2f}x", f"{r['flood_calls_per_s']:.0f}",
        )  # fmt: skip
    console.print(table)
    console.print("target (issue 48): flooded p50 within 1.5x of alone, with the per-session limit")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2)
    )
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

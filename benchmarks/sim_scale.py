"""The control plane and the router at 1,000 cells and 100,000 concurrent executions: what one driver process pays.

    python benchmarks/sim_scale.py [--cells 1000] [--executions 100000] [--window-s 20]

Real code throughout, modelled only where a machine is missing:
- **control plane**: the real `Controller` (its ZeroMQ ROUTER, heartbeats, state machines, the router's pool of
  managed engines) in this process on the driver's loop; ``--cells`` cells in a child process, each its own DEALER
  over TCP, saying Hello (serving) and then beating every ``controller.heartbeat_s`` as `gyre.control.cellprocess` does.
  Measured: messages per second each way, this process's CPU (loop and ZeroMQ's I/O thread) and its loop lag.
- **codec**: the controller's and the cells' own msgspec encoders and decoders on the real structs.
- **decisions**: what `ElasticLoop` does per decision (the controller's `cell_views`, `Books.observation`, the policy's
  `decide`, and the idle accounting's two passes over `Controller.ordered`) with ``--cells`` cells in the real
  controller and ``--executions`` in flight in real `Books`, over a stream of finishes, dispatches and role moves.
- **router bookkeeping**: the real `SessionStore` holding ``--executions`` sessions and the real `EnginePool` holding
  ``--cells`` managed engines: a session lookup and `EnginePool._pick` (sticky, and least loaded) per call; and the
  router's whole in-process chat call at turn 10 (`benchmarks/router.py`'s ``turn_costs``: rendering, ids, record).

Then the driver's budget: at N concurrent executions (one model call every ``--turn-s`` each, executions lasting
``--duration-s``), the share of one core each part needs, and where the single driver stops being enough. Writes
``benchmarks/results/sim_scale.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import zmq

from gyre.config import ControllerConfig
from gyre.control import cellprocess
from gyre.control import controller as controller_module
from gyre.control.books import Books
from gyre.control.controller import Controller, _Cell
from gyre.control.policy import Dispatch, ToServe, ToTrain, decide
from gyre.protocol import CellBeat, CellHello, ControllerMessage, ControlPing, StartTraining, SwitchDone
from gyre.router.pool import EnginePool
from gyre.router.sessions import SessionStore

HERE = Path(__file__).parent


# ---- the cells' side (a child process) ------------------------------------------------------------------------------
def run_cells(address: str, count: int, heartbeat_s: float, seconds: float) -> None:
    """``count`` cells, one DEALER each: Hello (serving), then a beat each every ``heartbeat_s``, spread evenly over
    the interval; prints what went each way during the steady phase (after every cell was welcomed)."""
    ctx = zmq.Context(io_threads=1)
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(ControllerMessage)
    socks = []
    timeout_s = 10 * heartbeat_s  # the controller's cell_timeout_s here
    seq = 1

    def hello(i: int) -> None:  # as a cell says Hello: at start, and again when the controller was silent
        socks[i].send(encoder.encode(CellHello(
            cell=f"cell-{i}", kind="core" if i == 0 else "satellite", order=i,
            engine_url=f"http://10.{i // 250}.{i % 250}.1:30000", capacity=100,
            core_address="tcp://10.0.0.1:5570" if i == 0 else "", role="serving", version=0,
            hostname=f"host-{i}", pid=1000 + i, seq=seq,
        )))  # fmt: skip
        said[i] = time.monotonic()

    said = [0.0] * count  # when each last heard from the controller, or said Hello
    for i in range(count):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        socks.append(sock)
        hello(i)
    which = {id(sock): i for i, sock in enumerate(socks)}
    hellos_again = 0
    poller = zmq.Poller()
    for sock in socks:
        poller.register(sock, zmq.POLLIN)
    welcomed: set[int] = set()
    received = {"welcome": 0, "ping": 0, "other": 0}
    sent = 0
    seq = 2
    gap = heartbeat_s / count
    start = next_beat = time.monotonic()
    steady_at = 0.0
    index = 0
    while True:
        now = time.monotonic()
        if steady_at and now - steady_at >= seconds:
            break
        if now - start > seconds + 120:
            raise SystemExit(f"only {len(welcomed)} of {count} cells were welcomed")
        while now >= next_beat:  # every cell beats once per heartbeat
            socks[index].send(
                encoder.encode(CellBeat(cell=f"cell-{index}", seq=seq, role="serving", version=0))
            )
            sent += 1 if steady_at else 0
            index += 1
            if index == count:
                index, seq = 0, seq + 1
                for i in range(count):
                    if now - said[i] > timeout_s:
                        hello(i)
                        hellos_again += 1
            next_beat += gap
        for sock, _ in poller.poll(timeout=max(int((next_beat - time.monotonic()) * 1000), 0)):
            while True:
                try:
                    message = decoder.decode(sock.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                said[which[id(sock)]] = time.monotonic()
                name = type(message).__name__
                if name == "CellWelcome":
                    welcomed.add(id(sock))
                if steady_at:
                    key = {"CellWelcome": "welcome", "ControlPing": "ping"}.get(name, "other")
                    received[key] += 1
        if not steady_at and len(welcomed) == count:
            steady_at = time.monotonic()
    elapsed = time.monotonic() - steady_at
    print(
        json.dumps(
            {
                "seconds": elapsed,
                "beats_sent": sent,
                "received": received,
                "hellos_again": hellos_again,
                "join_s": steady_at - start,
            }
        )
    )
    for sock in socks:
        sock.close(0)
    ctx.term()


# ---- the controller's side ---------------------------------------------------------------------------------------
async def control_plane(count: int, heartbeat_s: float, window_s: float) -> dict[str, float]:
    """The real controller under ``count`` heartbeating cells: rates, this process's CPU, loop lag."""
    cfg = ControllerConfig(bind="tcp://127.0.0.1:0", heartbeat_s=heartbeat_s, cell_timeout_s=10 * heartbeat_s)
    pool = EnginePool()
    lags: list[float] = []

    async def monitor(stop: asyncio.Event) -> None:
        while not stop.is_set():
            start = time.perf_counter()
            await asyncio.sleep(0.02)
            lags.append(time.perf_counter() - start - 0.02)

    async with Controller(cfg, pool) as controller:
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--as-cells", controller.address, "--cells", str(count),
            "--heartbeat-s", str(heartbeat_s), "--window-s", str(window_s), stdout=subprocess.PIPE,
        )  # fmt: skip
        await controller.wait_serving(count, 120)
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(monitor(stop))
            cpu, wall = time.process_time(), time.perf_counter()
            await asyncio.sleep(window_s * 0.9)  # inside the cells' steady phase
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            stop.set()
        out, _ = await child.communicate()
        if child.returncode:
            raise SystemExit(f"the cells' process failed ({child.returncode})")
        cells = json.loads(out)
        gone = controller.statistics().gone
        routed = len(pool.engines)
        await pool.aclose()
    beats = cells["beats_sent"] / cells["seconds"]
    pings = cells["received"]["ping"] / cells["seconds"]
    lags.sort()
    return {"cells": count, "beats_in_per_s": beats, "pings_out_per_s": pings,
            "messages_per_s": beats + pings, "cpu_fraction": cpu / wall,
            "cpu_us_per_message": cpu / wall / (beats + pings) * 1e6,
            "lag_p50_ms": lags[len(lags) // 2] * 1e3, "lag_p99_ms": lags[int(len(lags) * 0.99)] * 1e3,
            "gone": gone, "engines_routed": routed, "hellos_again": cells["hellos_again"],
            "join_s": cells["join_s"]}  # fmt: skip


def codec() -> dict[str, float]:
    """Microseconds to encode one message on one side and decode it on the other, with the modules' own codecs."""
    out = {}
    samples = {
        "CellBeat": CellBeat(cell="cell-517", seq=123456, role="serving", version=42),
        "CellHello": CellHello(cell="cell-517", kind="satellite", order=517, engine_url="http://10.2.17.1:30000",
                               capacity=100, role="serving", version=42, hostname="host-517", pid=4242, seq=1),
        "SwitchDone": SwitchDone(cell="cell-517", switch=901, role="training",
                                 phases={"stop_pushes": 0.01, "release": 0.2, "join": 0.5}, version=42),
        "ControlPing": ControlPing(),
        "StartTraining": StartTraining(switch=901),
    }  # fmt: skip
    for name, message in samples.items():
        to_controller = name in ("CellBeat", "CellHello", "SwitchDone")
        encoder = cellprocess._encoder if to_controller else controller_module._encoder
        decoder = controller_module._decoder if to_controller else cellprocess._decoder
        n = 20000
        start = time.perf_counter()
        for _ in range(n):
            decoder.decode(encoder.encode(message))
        out[name] = (time.perf_counter() - start) / n * 1e6
    return out


def decisions(cells: int, executions: int, events: int, seed: int = 0) -> dict[str, float]:
    """Seconds per decision as the live loop takes it, at ``cells`` cells and ``executions`` in flight."""
    rng = random.Random(seed)
    controller = Controller(ControllerConfig(), EnginePool())
    capacity = max(executions // cells, 1)
    for i in range(cells):
        controller.cells[f"cell-{i}"] = _Cell(f"cell-{i}", "core" if i == 0 else "satellite", i,
                                              f"http://10.0.0.{i}:30000", capacity, b"", role="serving",
                                              version=0)  # fmt: skip
    batch = max(executions // 2, 1)
    books = Books(batch_executions=batch, burst_steps=1, steps=1_000_000 // batch + 4)
    cfg = ControllerConfig()
    running: list[int] = []
    spent: list[float] = []
    level: list[int] = []  # executions in flight at each decision
    moves = 0

    def decide_once() -> None:
        nonlocal moves
        start = time.perf_counter()
        views = controller.cell_views()
        observed = books.observation(views, False, cfg.max_staleness)
        actions = decide(cfg, observed)
        controller.ordered()  # ElasticLoop._idle_cells walks the cells in order twice per iteration
        controller.ordered()
        spent.append(time.perf_counter() - start)
        level.append(observed.in_flight)
        for action in actions:  # carried out at once: the next decision sees the result
            match action:
                case ToTrain(cell=name):
                    controller.cells[name].role = "training"
                    moves += 1
                case ToServe(cell=name):
                    controller.cells[name].role = "serving"
                    moves += 1
                case Dispatch(current=c, next=n):
                    running.extend(books.dispatch(c + n))

    decide_once()  # fills the serving capacity
    spent.clear()
    level.clear()
    for k in range(events):
        index = running.pop(rng.randrange(len(running)))
        books.finish(index)
        step = books.train_step
        if books.ready.get(step, 0) and k % 3 == 0:  # trainers take data now and then; steps get applied
            books.take(books.ready[step])
            if books.taken >= batch:
                books.applied()
        decide_once()
    spent.sort()
    return {"cells": cells, "in_flight": statistics.fmean(level), "decisions": len(spent),
            "moves": moves, "mean_us": statistics.fmean(spent) * 1e6, "p50_us": spent[len(spent) // 2] * 1e6,
            "p99_us": spent[int(len(spent) * 0.99)] * 1e6}  # fmt: skip


async def router_bookkeeping(cells: int, sessions: int, calls: int, seed: int = 0) -> dict[str, float]:
    """Per call: a session lookup among ``sessions`` live ones and the engine pick among ``cells`` engines."""
    rng = random.Random(seed)
    store = SessionStore()
    tokens = [store.open(f"x{i}").token for i in range(sessions)]
    pool = EnginePool()
    for i in range(cells):
        engine = pool.add(f"http://10.{i // 250}.{i % 250}.1:30000", f"cell-{i}", managed=True)
        engine.outstanding_tokens = rng.randrange(100_000)
    names = list(pool.engines)
    picks = [rng.choice(tokens) for _ in range(calls)]
    start = time.perf_counter()
    for token in picks:
        session = store.get(token)
        assert session is not None
    lookup = (time.perf_counter() - start) / calls
    for token in picks:  # every session sticks to an engine, as after its first call
        store.get(token).affinity = names[hash(token) % cells]  # type: ignore[union-attr]
    start = time.perf_counter()
    for token in picks:
        session = store.get(token)
        engine = await pool._pick(session.affinity)  # type: ignore[union-attr]
        engine.inflight.add(token)
        engine.inflight.discard(token)
    sticky = (time.perf_counter() - start) / calls
    start = time.perf_counter()
    for token in picks:
        session = store.get(token)
        engine = await pool._pick(None)  # a first call: the least loaded serving engine
        engine.inflight.add(token)
        engine.inflight.discard(token)
    least = (time.perf_counter() - start) / calls
    await pool.aclose()
    return {"sessions": len(store), "engines": cells, "lookup_us": lookup * 1e6, "sticky_pick_us": sticky * 1e6,
            "least_loaded_pick_us": least * 1e6}  # fmt: skip


def router_call_ms() -> float:
    """The router's whole in-process chat call at turn 10 (ms), engine time excluded."""
    sys.path.insert(0, str(HERE))
    from gyre.engine.models import init_model
    from router import turn_costs  # type: ignore[import-not-found]

    with tempfile.TemporaryDirectory() as tmp:
        model = init_model(Path(tmp) / "tiny", preset="tiny", seed=0)
        return float(turn_costs(model, [10])["call"][10])


# ---- the budget ------------------------------------------------------------------------------------------------------
def budget(args: argparse.Namespace, plane: dict[str, float], decision: dict[str, float],
           books_router: dict[str, float], call_ms: float) -> list[dict[str, float]]:  # fmt: skip
    """Share of one core per part at N concurrent executions (cells: N / capacity, at least 1)."""
    rows = []
    per_message_s = plane["cpu_us_per_message"] / 1e6
    for n in (1_000, 10_000, 30_000, 100_000):
        cells = max(n // args.capacity, 1)
        messages = 2 * cells / args.heartbeat_s
        decisions_per_s = n / args.duration_s  # one per finished execution, at most (the loop coalesces)
        calls = n / args.turn_s
        control = messages * per_message_s
        decide_s = decisions_per_s * decision["mean_us"] / 1e6 * cells / decision["cells"]  # linear in cells
        router = calls * (
            call_ms / 1e3 + books_router["sticky_pick_us"] / 1e6 + books_router["lookup_us"] / 1e6
        )
        rows.append({"executions": n, "cells": cells, "messages_per_s": messages, "decisions_per_s": decisions_per_s,
                     "calls_per_s": calls, "control": control, "decide": decide_s, "router": router,
                     "total": control + decide_s + router})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--executions", type=int, default=100_000)
    parser.add_argument("--heartbeat-s", type=float, default=0.5, help="controller.heartbeat_s")
    parser.add_argument("--window-s", type=float, default=20.0, help="seconds the control plane is measured")
    parser.add_argument("--capacity", type=int, default=100, help="executions per serving cell (the budget)")
    parser.add_argument(
        "--turn-s", type=float, default=10.0, help="seconds between one execution's model calls"
    )
    parser.add_argument("--duration-s", type=float, default=1800.0, help="one execution, start to finish")
    parser.add_argument("--as-cells", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "sim_scale.json")
    args = parser.parse_args()
    if args.as_cells:
        run_cells(args.as_cells, args.cells, args.heartbeat_s, args.window_s)
        return

    from rich.console import Console
    from rich.table import Table

    from gyre.driver import eventloop

    console = Console()
    plane = eventloop.run(control_plane(args.cells, args.heartbeat_s, args.window_s))
    table = Table(title=f"Control plane: the real controller, {args.cells} cells over TCP, "
                        f"heartbeat {args.heartbeat_s:g} s, {args.window_s:g} s measured")  # fmt: skip
    for col in ("all joined", "beats in/s", "pings out/s", "driver CPU", "CPU per message", "loop lag p50/p99",
                "gone", "Hellos again"):  # fmt: skip
        table.add_column(col, justify="right")
    table.add_row(f"{plane['join_s']:.1f} s", f"{plane['beats_in_per_s']:,.0f}", f"{plane['pings_out_per_s']:,.0f}",
                  f"{plane['cpu_fraction']:.1%} of a core", f"{plane['cpu_us_per_message']:.1f} µs",
                  f"{plane['lag_p50_ms']:.2f} / {plane['lag_p99_ms']:.2f} ms", str(plane["gone"]),
                  str(plane["hellos_again"]))  # fmt: skip
    console.print(table)

    codecs = codec()
    table = Table(title="msgspec: encode on one side + decode on the other, per message")
    for col in ("message", "µs", "per second at the rates above"):
        table.add_column(col, justify="right")
    for name, us in codecs.items():
        rate = {"CellBeat": plane["beats_in_per_s"], "ControlPing": plane["pings_out_per_s"]}.get(name, 0.0)
        table.add_row(name, f"{us:.2f}", f"{rate * us / 1e6:.2%} of a core" if rate else "-")
    console.print(table)

    table = Table(
        title="Decisions: cell_views + observation + decide + idle accounting, as ElasticLoop takes them"
    )
    for col in ("cells", "in flight", "decisions", "moves", "mean", "p50", "p99"):
        table.add_column(col, justify="right")
    sweep = []
    for cells, executions in ((10, 1_000), (100, 10_000), (args.cells, args.executions)):
        d = decisions(cells, executions, min(3000, executions // 2))
        sweep.append(d)
        table.add_row(f"{cells:,}", f"{d['in_flight']:,.0f}", f"{d['decisions']:,}", f"{d['moves']:,}",
                      f"{d['mean_us']:.0f} µs", f"{d['p50_us']:.0f} µs", f"{d['p99_us']:.0f} µs")  # fmt: skip
    console.print(table)

    books_router = eventloop.run(router_bookkeeping(args.cells, args.executions, 100_000))
    call_ms = router_call_ms()
    table = Table(title=f"Router per call: {books_router['sessions']:,} sessions, {args.cells:,} engines")
    for col in ("session lookup", "sticky pick", "least-loaded pick", "whole call (in-process, turn 10)"):
        table.add_column(col, justify="right")
    table.add_row(f"{books_router['lookup_us']:.2f} µs", f"{books_router['sticky_pick_us']:.2f} µs",
                  f"{books_router['least_loaded_pick_us']:.0f} µs", f"{call_ms:.3f} ms")  # fmt: skip
    console.print(table)

    rows = budget(args, plane, sweep[-1], books_router, call_ms)
    table = Table(title=f"One driver's loop: share of a core (a call every {args.turn_s:g} s per execution, "
                        f"executions of {args.duration_s:g} s, {args.capacity} per cell)")  # fmt: skip
    for col in ("executions", "cells", "control msgs/s", "decisions/s", "calls/s", "control", "decide", "router",
                "total"):  # fmt: skip
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r['executions']:,}", f"{r['cells']:,}", f"{r['messages_per_s']:,.0f}",
                      f"{r['decisions_per_s']:,.0f}", f"{r['calls_per_s']:,.0f}", f"{r['control']:.1%}",
                      f"{r['decide']:.1%}", f"{r['router']:.0%}", f"{r['total']:.0%}")  # fmt: skip
    console.print(table)
    full = next((r["executions"] for r in rows if r["total"] >= 1.0), None)
    per_core = 1.0 / (call_ms / 1e3) * args.turn_s
    console.print(f"the router's calls alone fill one core at about {per_core:,.0f} concurrent executions "
                  f"({1e3 / call_ms:,.0f} calls/s); first row past one core: {full}")  # fmt: skip
    out = {"args": {k: v for k, v in vars(args).items() if k not in ("out", "as_cells")}, "control_plane": plane,
           "codec_us": codecs, "decisions": sweep, "router": books_router, "router_call_ms": call_ms,
           "budget": rows, "cpus": os.cpu_count()}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

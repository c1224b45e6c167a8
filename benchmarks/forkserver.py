"""What a Gyre process costs to start and to end: a fresh interpreter against a child of `gyre.control.forkserver`.

Each round starts ``gyre serve-engine`` on the tiny model (``--kind engine``) or ``gyre router`` in front of nothing
(``--kind router``), waits until ``/health`` answers, stops it with SIGTERM and waits for its end. It prints, side
by side, the wall seconds to ready and to the end, and the CPU seconds the process spent (read from ``/proc`` just
before it exits: its user and system time, imports included).

    .venv/bin/python benchmarks/forkserver.py --rounds 5 --kind engine
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from gyre.control import forkserver
from gyre.engine.launcher import free_port
from gyre.engine.models import init_model


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(kind: str, model: Path) -> dict[str, float]:
    port = free_port()
    argv = [sys.executable, "-m", "gyre", "serve-engine", "--model", str(model), "--port", str(port)]
    if kind == "router":
        argv = [sys.executable, "-m", "gyre", "router", "--model", str(model), "--port", str(port),
                "--admin-port", str(free_port()), "--engines", ""]  # fmt: skip
    started = time.perf_counter()
    proc = forkserver.spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"{kind} exited with {proc.returncode} before it served")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    ready = time.perf_counter() - started
    cpu_ready = cpu_seconds(proc.pid)
    stopping = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)
    return {"ready_s": ready, "end_s": time.perf_counter() - stopping, "cpu_ready_s": cpu_ready}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kind", choices=["engine", "router"], default="engine")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gyre-forkserver-bench-") as tmp:
        model = init_model(Path(tmp) / "tiny", preset="tiny", seed=0)
        socket_path = os.path.join(tmp, "socket")
        server = forkserver.start_server(socket_path)
        try:
            results: dict[str, list[dict[str, float]]] = {"fresh": [], "forked": []}
            os.environ[forkserver.ENV] = socket_path
            one(args.kind, model)  # the server's imports, not counted
            for _ in range(args.rounds):  # interleaved, so both see the same machine
                os.environ.pop(forkserver.ENV)
                results["fresh"].append(one(args.kind, model))
                os.environ[forkserver.ENV] = socket_path
                results["forked"].append(one(args.kind, model))
        finally:
            server.kill()
            server.wait()
    print(f"gyre {args.kind}: {args.rounds} rounds, medians")
    print(f"{'':8} {'to ready (s)':>13} {'CPU to ready (s)':>17} {'SIGTERM to end (s)':>19}")
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in results.items()}
    for mode, m in med.items():
        print(f"{mode:8} {m['ready_s']:13.2f} {m['cpu_ready_s']:17.2f} {m['end_s']:19.2f}")
    print(f"forked / fresh: to ready {med['forked']['ready_s'] / med['fresh']['ready_s']:.2f}x, "
          f"CPU {med['forked']['cpu_ready_s'] / med['fresh']['cpu_ready_s']:.2f}x, "
          f"end {med['forked']['end_s'] / med['fresh']['end_s']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()

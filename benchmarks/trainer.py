"""The elastic trainer: satellite join time, weight-transfer bandwidth against a raw broadcast, step throughput.

    python benchmarks/trainer.py [--micro-steps 48] [--tokens 512] [--trials 2]

Prints three tables and writes ``benchmarks/results/trainer.json``:
1. satellite join: from its ``Hello`` to its first gradient sent, on the tiny and the ~25 M ``small`` preset (the
   satellite builds its model from the core's config and receives the step's weights inside that time);
2. weight transfer of the ``small`` preset (~100 MB fp32): core -> satellite (``Refresh``) and core -> embedded engine
   (``/update_weights_from_distributed``, flattened bucket), each the fastest of 4-5 transfers, against the fastest of
   5 raw gloo broadcasts of the same bytes between two processes of this run (one flat tensor), side by side;
3. step throughput (trained tokens/s) of one step of random chains with 1, 2 and 3 trainer processes (the core
   computing, plus 0-2 satellites), one torch thread each, best of ``--trials``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from gyre.engine import weight_sync
from gyre.engine.launcher import free_port, launch_embedded
from gyre.engine.models import count_parameters, init_model
from gyre.protocol import MicroStep
from gyre.train.satellite import Satellite, SatelliteSummary
from gyre.train.trainerclient import TrainerClient, launch_core, launch_satellite


def micro_steps(count: int, tokens: int, seed: int = 0, vocab: int = 260) -> list[MicroStep]:
    """Chains of random tokens (sizes 0.5-1.5x ``tokens``); weights sum to 1 over the step."""
    rng = random.Random(seed)
    sizes = [rng.randrange(tokens // 2, tokens * 3 // 2) for _ in range(count)]
    total = sum(n - 1 for n in sizes)
    return [
        MicroStep(input_ids=[rng.randrange(vocab) for _ in range(n)], position_ids=list(range(n)),
                  parents=[-1, *range(n - 1)], weights=[0.0] + [1.0 / total] * (n - 1),
                  advantages=[rng.uniform(-1, 1)] * n, behaviour_logprobs=[-5.0] * n, versions=[0] * n, sequences=1)
        for n in sizes
    ]  # fmt: skip


def _core(model: Path, tmp: Path, name: str, core_computes: bool = True) -> tuple[Any, str]:
    address = f"tcp://127.0.0.1:{free_port()}"
    overrides = [f'trainer.model_path="{model}"', "trainer.num_threads=1",
                 f"trainer.core_computes={str(core_computes).lower()}"]  # fmt: skip
    return launch_core(None, overrides, address, log=tmp / f"{name}.log"), address


def join_and_transfer(model: Path, tmp: Path, name: str, steps: int = 4) -> tuple[SatelliteSummary, float]:
    """A satellite (in this process) joining an open step, then ``steps`` more steps with an engine attached: its
    summary (join time, fastest weight receive) and the fastest weight push to the engine."""
    core, address = _core(model, tmp, f"core-{name}", core_computes=False)
    client = TrainerClient(address)
    overrides = ["engine.kv_cache_mem_gib=0.05", "engine.num_threads=1"]
    try:
        with launch_embedded(model, overrides=overrides) as engine:
            client.submit(0, micro_steps(4, 256), seal=True)
            satellite = Satellite(address, "bench", num_threads=1)
            summaries: list[SatelliteSummary] = []
            thread = threading.Thread(target=lambda: summaries.append(satellite.run()))
            thread.start()
            client.wait_step(0, timeout_s=600)
            client.attach_engine(engine.url, timeout_s=600)
            for step in range(1, steps + 1):  # every step: new weights to the satellite and to the engine
                client.submit(step, micro_steps(2, 64, seed=step), seal=True)
                client.wait_step(step, timeout_s=600)
            push_s = client.statistics().push_s[engine.url]
            client.release("bench")
            thread.join()
        return summaries[0], push_s
    finally:
        client.shutdown()
        client.close()
        core.wait(30)


def _receiver(port: int, numel: int, rounds: int) -> None:
    group = weight_sync.create_group("127.0.0.1", port, 1, 2, "raw")
    buffer = torch.zeros(numel)  # allocated (and its pages touched) once, as the members' buffers are
    for _ in range(rounds):
        group.broadcast(buffer, src=0)


def raw_broadcast(numel: int, rounds: int = 5) -> float:
    """Best seconds of a gloo broadcast of ``numel`` fp32 values (one flat tensor) to another process."""
    port = free_port()
    child = mp.get_context("spawn").Process(target=_receiver, args=(port, numel, rounds + 1))
    child.start()
    group = weight_sync.create_group("127.0.0.1", port, 0, 2, "raw")
    flat = torch.randn(numel)
    group.broadcast(flat)  # warm-up
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        group.broadcast(flat)
        best = min(best, time.perf_counter() - started)
    child.join()
    return best


def throughput(model: Path, tmp: Path, processes: int, items: list[MicroStep], trial: int) -> float:
    """Trained tokens per second of one step computed by ``processes`` trainer processes."""
    core, address = _core(model, tmp, f"core-tp{processes}-{trial}")
    client = TrainerClient(address)
    names = [f"sat{i}" for i in range(processes - 1)]
    sats = [launch_satellite(address, n, 1, log=tmp / f"{n}-{trial}.log") for n in names]
    try:
        deadline = time.monotonic() + 120
        while len(client.statistics().members) < len(names):
            if time.monotonic() > deadline:
                raise RuntimeError("satellites did not join")
            time.sleep(0.1)
        client.submit(0, micro_steps(2, 64, seed=99), seal=True)  # warm-up step: every member has weights
        client.wait_step(0, timeout_s=600)
        client.submit(1, items, seal=True)
        metrics = client.wait_step(1, timeout_s=1800)
        return metrics.computed_tokens / metrics.seconds
    finally:
        client.shutdown()
        client.close()
        for proc in [core, *sats]:
            proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--micro-steps", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=512, help="mean tokens per micro-step")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--no-throughput", action="store_true", help="only the join and transfer tables")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "trainer.json")
    args = parser.parse_args()
    console = Console()
    torch.set_num_threads(1)
    result: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
    }
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        models = {p: init_model(tmp / p, preset=p) for p in ("tiny", "small")}
        joins = {p: join_and_transfer(m, tmp, p) for p, m in models.items()}
        table = Table(title="Satellite join: Hello -> first gradient sent (model built, weights received)")
        for col in ("preset", "parameters", "join", "target"):
            table.add_column(col, justify="right")
        for preset, (summary, _) in joins.items():
            table.add_row(
                preset, f"{count_parameters(models[preset]):,}", f"{summary.join_s:.3f} s", "< 1 s (tiny)"
            )
        console.print(table)

        small, push_s = joins["small"]
        raw_s = raw_broadcast(small.weights_bytes // 4)
        mb = small.weights_bytes / 1e6
        table = Table(
            title=f"Weight transfer, small preset ({mb:.0f} MB fp32), vs raw gloo broadcast of the same bytes"
        )
        for col in ("path", "seconds", "MB/s", "share of raw", "target"):
            table.add_column(col, justify="right")
        rows = [("raw broadcast (1 tensor)", raw_s), ("core -> satellite", small.weights_s),
                ("core -> engine", push_s)]  # fmt: skip
        for label, secs in rows:
            table.add_row(label, f"{secs:.3f}", f"{mb / secs:,.0f}", f"{raw_s / secs:.0%}", ">= 80%")
        console.print(table)

        items = micro_steps(args.micro_steps, args.tokens)
        counts = () if args.no_throughput else (1, 2, 3)
        speeds = {
            n: max(throughput(models["tiny"], tmp, n, items, t) for t in range(args.trials)) for n in counts
        }
        table = Table(
            title=f"Step throughput, tiny preset, {len(items)} micro-steps of ~{args.tokens} tokens"
        )
        for col in ("trainer processes", "tokens/s", "vs 1 process"):
            table.add_column(col, justify="right")
        for n, speed in speeds.items():
            table.add_row(str(n), f"{speed:,.0f}", f"{speed / speeds[1]:.2f}x")
        if speeds:
            console.print(table)

    result |= {
        "join_s": {p: s.join_s for p, (s, _) in joins.items()},
        "transfer": {
            "bytes": small.weights_bytes,
            "raw_s": raw_s,
            "satellite_s": small.weights_s,
            "engine_s": push_s,
        },
        "throughput_tok_s": speeds,
        "micro_steps": args.micro_steps,
        "tokens": args.tokens,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

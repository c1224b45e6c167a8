"""Megatron-core backend vs torch backend on CPU: micro-step throughput on the same micro-steps and weights.

    python benchmarks/megatron.py [--preset small] [--micro-steps 6] [--tokens 512] [--threads 2] [--trials 2]

For chains and for trees (a trunk with two branches), times forward + backward + the gradient in the exchange
layout of the same micro-steps with the torch backend (a Hugging Face model) and with the Megatron backend alone,
with two tensor-parallel ranks and with two pipeline stages (``threads`` split between the processes), each in a
fresh process after one warm-up micro-step, best of ``--trials`` alternating runs. Also times a weight load (the
core's flat buffer into Megatron's shards). Prints a table with the ratio to torch and writes
``benchmarks/results/megatron.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from gyre.engine.models import count_parameters, init_model
from gyre.protocol import MicroStep

WORKER = """
import json, sys, time, msgspec, torch
from gyre.config import LossConfig
from gyre.protocol import MicroStep
from gyre.train.state import flatten_parameters, load_model
backend, threads, model, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
tensor, pipeline = int(sys.argv[5]), int(sys.argv[6])
torch.set_num_threads(threads)
micro = msgspec.msgpack.decode(open(steps, "rb").read(), type=list[MicroStep])
hf = load_model(model)
if backend == "torch":
    from gyre.train.learner import TorchLearner
    learner = TorchLearner(hf)
    load_s = 0.0
else:
    from gyre.train.megatron.member import MegatronLearner
    learner = MegatronLearner(json.load(open(model + "/config.json")), tensor, pipeline, threads)
    learner.weights().copy_(flatten_parameters(hf))
    started = time.perf_counter()
    learner.loaded(0)
    load_s = time.perf_counter() - started
loss = LossConfig()
learner.compute(micro[0], loss, 0); learner.gradient()  # warm-up
started = time.perf_counter()
for m in micro:
    learner.compute(m, loss, 0)
    learner.gradient()
took = time.perf_counter() - started
print(json.dumps({"seconds": took, "tokens": sum(len(m.input_ids) for m in micro), "load_s": load_s}))
learner.close()
"""


LAYOUTS = (("torch", 1, 1), ("megatron", 1, 1), ("megatron", 2, 1), ("megatron", 1, 2))


def micro_steps(count: int, tokens: int, tree: bool, seed: int = 0) -> list[MicroStep]:
    """``count`` micro-steps of ``tokens`` tokens: one chain each, or a trunk with two branches off it."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        if tree:
            trunk = tokens // 2
            parents = [-1, *range(trunk - 1)]
            depth = list(range(trunk))
            for _ in range(2):
                at = rng.randrange(trunk // 4, trunk)
                n = (tokens - trunk) // 2
                parents += [at, *range(len(parents), len(parents) + n - 1)]
                depth += [depth[at] + 1 + i for i in range(n)]
        else:
            parents, depth = [-1, *range(tokens - 1)], list(range(tokens))
        n = len(parents)
        out.append(MicroStep(input_ids=[rng.randrange(256) for _ in range(n)], position_ids=depth, parents=parents,
                             weights=[0.0] + [1.0 / (n * count)] * (n - 1), advantages=[rng.uniform(-1, 1)] * n,
                             behaviour_logprobs=[-5.0] * n, versions=[0] * n, sequences=1))  # fmt: skip
    return out


def run(backend: str, tensor: int, pipeline: int, threads: int, model: Path, steps: Path) -> dict[str, Any]:
    per_process = max(threads // (tensor * pipeline), 1)
    args = [backend, str(per_process), str(model), str(steps), str(tensor), str(pipeline)]
    done = subprocess.run([sys.executable, "-c", WORKER, *args], capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise SystemExit(f"{backend} TP={tensor} x PP={pipeline} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small", choices=["tiny", "small"])
    parser.add_argument("--micro-steps", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--trials", type=int, default=2, help="runs of each backend, alternating; the best counts"
    )
    args = parser.parse_args()
    console = Console()
    results: dict[str, Any] = {
        "preset": args.preset,
        "tokens": args.tokens,
        "threads": args.threads,
        "rows": [],
    }
    table = Table(title=f"{args.preset} preset, {args.micro_steps} micro-steps of {args.tokens} tokens, "
                        f"{args.threads} threads in all")  # fmt: skip
    for column in ("shape", "backend", "tokens/s", "vs torch", "weight load s"):
        table.add_column(column, justify="right" if column != "backend" else "left")
    with tempfile.TemporaryDirectory() as tmp:
        model = init_model(Path(tmp) / args.preset, preset=args.preset)
        results["parameters"] = count_parameters(model)
        for shape in ("chain", "tree"):
            steps = Path(tmp) / f"{shape}.msgpack"
            steps.write_bytes(
                msgspec.msgpack.encode(micro_steps(args.micro_steps, args.tokens, shape == "tree"))
            )
            base = 0.0
            runs: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
            for trial in range(args.trials):  # alternating: a slow minute of the machine hits every layout
                for backend, tp, pp in LAYOUTS:
                    with console.status(f"{shape}: {backend} TP={tp} x PP={pp}, trial {trial + 1}"):
                        result = run(backend, tp, pp, args.threads, model, steps)
                    runs.setdefault((backend, tp, pp), []).append(result)
            for (backend, tp, pp), trials in runs.items():
                r = min(trials, key=lambda t: t["seconds"])
                rate = r["tokens"] / r["seconds"]
                base = base or rate
                label = "torch" if backend == "torch" else f"megatron TP={tp} x PP={pp}"
                results["rows"].append({"shape": shape, "backend": label, "tokens_per_s": rate,
                                        "ratio": rate / base, "load_s": r["load_s"]})  # fmt: skip
                table.add_row(shape, label, f"{rate:,.0f}", f"{rate / base:.2f}x", f"{r['load_s']:.3f}")
    console.print(table)
    out = Path(__file__).parent / "results" / "megatron.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()

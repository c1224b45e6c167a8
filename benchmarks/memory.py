"""Training-cell memory: today's core measured against the accounting model, then Qwen3 on 8 x 80 GB cells.

    python benchmarks/memory.py [--micro-tokens 65536] [--ranks 1 2 4] [--tokens 256] [--no-measure]

Prints six tables and writes ``benchmarks/results/memory.json``:
1. measured vs predicted: a real ``TrainState`` (today's core, one process, fp32, float64 step sum) of the ``small``
   preset and of a ~150 M-parameter Qwen3 (written here from a config, no download), each in its own process after
   one AdamW update and one micro-step's backward: weights, gradients and AdamW bytes counted from the tensors, next
   to ``gyre.train.memory``'s prediction for one rank, and the process's peak RSS;
2. a sharded core cell measured (``benchmarks/memory_cell.py``): the same two models on 1, 2 and 4 ranks, each rank
   a process over gloo with a ``ShardedState``, two steps of real micro-steps reduced round by round as the wired
   core does: per rank the optimizer + gradient bytes (from the tensors) against the 1-rank figure, peak RSS and
   the second step's wall;
3. gradient bytes into any one process per step, measured in that run: today's star (every micro-step not computed
   by the core sends its whole fp32 gradient to it: counted) against the bytes one rank's reduce-scatters wrote to
   its sockets (measured), and what ``gyre.train.memory`` predicts;
4. the same projected by ``gyre.train.memory`` for these models and Qwen3: today's star (every remote micro-step's
   whole fp32 gradient into the core) against one bucketed reduce-scatter per step (ZeRO-1), for several micro-step
   and member counts;
5. Qwen3-8B, Qwen3-32B and Qwen3-235B-A22B on 8 x 80 GB cells: per-GPU bytes by category, fits or not, and the
   longest micro-step that fits, for today's design and sharded layouts (plus the smallest multi-cell layout that
   holds the MoE);
6. the assumptions of the model (``gyre.train.memory.ASSUMPTIONS``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from gyre.train.memory import (
    ASSUMPTIONS,
    BF16,
    BF16_FP32_GRADS,
    CATEGORIES,
    FP32,
    GIB,
    CellLayout,
    Design,
    DeviceMemory,
    ModelShape,
    Precision,
    device_memory,
    gradient_traffic,
    max_micro_tokens,
)

# config.json fields as published on the Hugging Face Hub (Qwen/Qwen3-8B, Qwen/Qwen3-32B, Qwen/Qwen3-235B-A22B).
QWEN3 = {
    "Qwen3-8B": {
        "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
        "tie_word_embeddings": False,
    },
    "Qwen3-32B": {
        "model_type": "qwen3", "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 25600, "vocab_size": 151936,
        "tie_word_embeddings": False,
    },
    "Qwen3-235B-A22B": {
        "model_type": "qwen3_moe", "hidden_size": 4096, "num_hidden_layers": 94, "num_attention_heads": 64,
        "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 12288, "moe_intermediate_size": 1536,
        "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "vocab_size": 151936, "tie_word_embeddings": False,
    },
}  # fmt: skip
# ~150 M parameters with the presets' byte-level tokenizer: the small preset's architecture, scaled
MEDIUM = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 16,
          "num_key_value_heads": 8, "head_dim": 64}  # fmt: skip
CELL_GB = 80
# the measured cells: micro-steps each rank computes per step (one reduce-scatter round each), sized so that the
# whole program runs in about 6 minutes on 2 CPU cores (the ~150 M cell at 4 ranks moves 1.8 GB per rank per round)
MICRO_PER_RANK = {"small": 4, "~150M": 1}
MODES = {
    "small": ("round", "step"),
    "~150M": ("step",),
}  # reduced a round (before) or once a step (the cell now)
CELL_STEPS = 2  # the second step is the timed one
CELL_BUCKET_MIB = 64.0  # float64 gradient per reduce-scatter call (trainer.bucket_mib's default: 512)


def gb(n: int) -> str:
    return f"{n / GIB:.1f}"


# ---- 1. measured on this machine ------------------------------------------------------------------------------
def write_medium(directory: Path, small: Path) -> Path:
    """A ~150 M-parameter Qwen3 directory: ``small``'s config with MEDIUM's sizes, freshly initialised."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    config = json.loads((small / "config.json").read_text()) | MEDIUM
    config.pop("layer_types", None)  # one per layer: derived again from the new layer count
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config), dtype=torch.float32)
    model.save_pretrained(directory, safe_serialization=True)
    return directory


def _measure(model_dir: str, queue: Any) -> None:
    """In a fresh process: today's core state after one update and one micro-step's backward, counted."""
    import torch
    from transformers.utils import logging as hf_logging

    from gyre.config import TrainerConfig
    from gyre.protocol import MicroStep
    from gyre.train.memory import held_bytes
    from gyre.train.objective import compute_gradients
    from gyre.train.state import TrainState

    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    state = TrainState(TrainerConfig(model_path=model_dir))
    state.apply()  # AdamW's moments exist from here
    n = 256
    micro = MicroStep(input_ids=[i % 256 for i in range(n)], position_ids=list(range(n)),
                      parents=[-1, *range(n - 1)], weights=[0.0] + [1 / (n - 1)] * (n - 1), advantages=[1.0] * n,
                      behaviour_logprobs=[-5.0] * n, versions=[0] * n, sequences=1)  # fmt: skip
    compute_gradients(state.model, micro, state.cfg.loss, state.version)
    counted = held_bytes(state.model, state.optimizer, state.gradient_sum)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    queue.put({"config": state.model.config.to_dict(), "measured": counted, "peak_rss": peak})


def measure(model_dir: Path) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(str(model_dir), queue))
    proc.start()
    result: dict[str, Any] = queue.get(timeout=1200)
    proc.join()
    return result


def measured_table(console: Console, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    table = Table(
        title="Today's core, one process on CPU (fp32, float64 step sum): counted from tensors vs predicted"
    )
    for col in ("model", "parameters", "category", "measured MB", "predicted MB", "error"):
        table.add_column(col, justify="right")
    out: dict[str, Any] = {}
    for name, run in runs.items():
        shape = ModelShape.from_config(run["config"])
        p = device_memory(shape, CellLayout(), FP32, design="star", engine_bytes=4, receive_buffers=0)
        predicted = {"weights": p.weights, "gradients": p.gradients, "moments": p.moments + p.master}
        rows = {}
        for cat, value in predicted.items():
            got = run["measured"][cat]
            error = got / value - 1
            rows[cat] = {"measured": got, "predicted": value, "error": error}
            table.add_row(name, f"{shape.parameters():,}", cat, f"{got / 1e6:,.1f}", f"{value / 1e6:,.1f}",
                          f"{error:+.2%}")  # fmt: skip
        table.add_row(name, "", "peak RSS", f"{run['peak_rss'] / 1e6:,.0f}", "", "", end_section=True)
        out[name] = {"parameters": shape.parameters(), "categories": rows, "peak_rss": run["peak_rss"]}
    console.print(table)
    return out


# ---- 1b. a sharded core cell, measured --------------------------------------------------------------------------
def measure_cells(dirs: dict[str, Path], ranks: list[int], tokens: int, progress: Progress) -> dict[str, Any]:
    """Every model on every number of ranks, in each of its modes (``memory_cell.run_cell``): each rank's figures."""
    from memory_cell import run_cell

    runs = [(name, world, mode) for name in dirs for mode in MODES[name] for world in ranks]
    task = progress.add_task("sharded cells", total=len(runs))
    out: dict[str, Any] = {}
    for name, world, mode in runs:
        progress.update(task, description=f"sharded cell: {name}, {world} rank(s), reduced a {mode}")
        k = MICRO_PER_RANK[name]
        out[f"{name}/{world}/{mode}"] = {
            "model": name, "world": world, "mode": mode, "micro_per_rank": k, "tokens": tokens,
            "ranks": run_cell(dirs[name], world, k, tokens, CELL_STEPS, CELL_BUCKET_MIB, mode),
        }  # fmt: skip
        progress.advance(task)
    return out


def cell_rows(cells: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per cell: the largest figure over its ranks, against the same model's 1-rank cell in its mode."""
    rows = []
    for cell in cells.values():
        ranks, world = cell["ranks"], cell["world"]
        last = [r["steps"][-1] for r in ranks]
        state = max(r["statistics"]["gradient_bytes"] + r["statistics"]["optimizer_bytes"] for r in ranks)
        numel, k = ranks[0]["numel"], cell["micro_per_rank"]
        rows.append({
            "model": cell["model"], "world": world, "mode": cell["mode"], "micro_per_rank": k,
            "tokens": cell["tokens"], "parameters": numel, "state_bytes": state,
            "master_bytes": max(r["statistics"]["master_bytes"] for r in ranks),
            "local_bytes": max(s["local_bytes"] for s in last), "reductions": max(s["reductions"] for s in last),
            "peak_rss": max(r["peak_rss"] for r in ranks), "step_s": max(s["wall_s"] for s in last),
            "reduce_s": max(s["reduce_s"] for s in last), "apply_s": max(s["apply_s"] for s in last),
            "reduce_socket_bytes": max(s["reduce_socket_bytes"] for s in last),
            "apply_socket_bytes": max(s["apply_socket_bytes"] for s in last),
            "model_gradient": numel * 4,  # one whole fp32 gradient
            "ring": (world - 1) * numel * 8 // world,  # one float64 ring reduce-scatter of the whole model
            "predicted": gradient_traffic(ModelShape.from_config(ranks[0]["config"]), CellLayout(shards=world), FP32,
                                          remote_micro_steps=(world - 1) * k, satellites=0).reduce_scatter,
        })  # fmt: skip
    for row in rows:
        one = next(
            r for r in rows if r["model"] == row["model"] and r["world"] == 1 and r["mode"] == row["mode"]
        )
        row["state_fraction"] = row["state_bytes"] / one["state_bytes"]
        row["state_ok"] = row["state_fraction"] <= 1.05 / row["world"]
        row["wire_ok"] = row["reduce_socket_bytes"] <= 2 * row["model_gradient"]
    return rows


def cell_tables(console: Console, rows: list[dict[str, Any]]) -> None:
    mb = 1e6
    table = Table(title="Sharded core cell, measured: N rank processes over gloo on this machine, each a "
                  "ShardedState and a whole replica; the second of two steps")  # fmt: skip
    for col in ("model", "ranks", "reduced", "micro-steps / rank", "opt + grad MB / rank", "of 1 rank", "<= 1.05/N",
                "master MB / rank", "local sum MB", "peak RSS MB / rank", "step s", "compute + reduce s",
                "apply s"):  # fmt: skip
        table.add_column(col, justify="right")
    for i, r in enumerate(rows):
        last = i == len(rows) - 1 or (rows[i + 1]["model"], rows[i + 1]["mode"]) != (r["model"], r["mode"])
        table.add_row(r["model"], str(r["world"]), f"a {r['mode']}", str(r["micro_per_rank"]),
                      f"{r['state_bytes'] / mb:,.0f}", f"{r['state_fraction']:.4f}",
                      "[green]yes[/]" if r["state_ok"] else "[red]no[/]", f"{r['master_bytes'] / mb:,.0f}",
                      f"{r['local_bytes'] / mb:,.0f}", f"{r['peak_rss'] / mb:,.0f}", f"{r['step_s']:.1f}",
                      f"{r['reduce_s']:.1f}", f"{r['apply_s']:.1f}", end_section=last)  # fmt: skip
    console.print(table)
    cores = len(os.sched_getaffinity(0))
    console.print(f"{cores} CPU core(s): above {cores} ranks the ranks time-share them, so step time is no speed-up "
                  "figure. opt + grad: float64 gradient sum + AdamW moments of the rank's range; local sum: the "
                  "rank's float64 sum of its own micro-steps (reduced a step), none when reduced a round; peak RSS: "
                  "ru_maxrss, the whole replica, its .grad and one flat fp32 gradient included.",
                  highlight=False)  # fmt: skip
    table = Table(title="Gradient bytes each rank wrote to its sockets per step (TCP_INFO), reduced once a round "
                  "(before) and once a step (now), side by side")  # fmt: skip
    for col in ("model", "ranks", "micro-steps / rank", "model grad MB", "a round MB", "a round x", "a step MB",
                "a step x", "<= 2x", "float64 ring x", "weights x"):  # fmt: skip
        table.add_column(col, justify="right")
    by_key = {(r["model"], r["world"], r["mode"]): r for r in rows}
    for r in [r for r in rows if r["mode"] == "step" and r["world"] > 1]:
        grad = r["model_gradient"]
        before = by_key.get((r["model"], r["world"], "round"))
        table.add_row(r["model"], str(r["world"]), str(r["micro_per_rank"]), f"{grad / mb:,.0f}",
                      "-" if before is None else f"{before['reduce_socket_bytes'] / mb:,.0f}",
                      "-" if before is None else f"{before['reduce_socket_bytes'] / grad:.2f}x",
                      f"{r['reduce_socket_bytes'] / mb:,.0f}", f"{r['reduce_socket_bytes'] / grad:.2f}x",
                      "[green]yes[/]" if r["wire_ok"] else "[red]no[/]", f"{r['ring'] / grad:.2f}x",
                      f"{r['apply_socket_bytes'] / grad:.2f}x")  # fmt: skip
    console.print(table)
    console.print("x: multiples of the model's fp32 gradient. a round: gloo's reduce-scatter of each micro-step's "
                  "float64 gradient (2(N-1)/N of it per rank, what an all-reduce moves); a step: the rank's local "
                  "float64 sum reduced once by a ring ((N-1)/N), however many micro-steps. float64 ring: that "
                  "figure counted, not measured. weights: the all-gather of the updated fp32 weights ((N-1)/N).",
                  highlight=False)  # fmt: skip


# ---- 2. gradient bytes per step -------------------------------------------------------------------------------
def traffic_table(console: Console, shapes: dict[str, ModelShape]) -> list[dict[str, Any]]:
    table = Table(
        title="Gradient bytes into any one process per step: star today vs one bucketed reduce-scatter"
    )
    for col in ("model", "core layout", "remote micro-steps", "satellites", "star GB", "reduce-scatter GB",
                "star / model grad", "r-s / model grad"):  # fmt: skip
        table.add_column(col, justify="right")
    rows = []
    for name, shape in shapes.items():
        layout = CellLayout(shards=8) if shape.parameters() > 1e9 else CellLayout(shards=2)
        for micro, satellites in ((8, 1), (64, 1), (64, 8)):
            t = gradient_traffic(shape, layout, BF16, remote_micro_steps=micro, satellites=satellites)
            rows.append(
                {
                    "model": name,
                    "shards": layout.shards,
                    "remote_micro_steps": micro,
                    "satellites": satellites,
                    "star": t.star,
                    "reduce_scatter": t.reduce_scatter,
                    "model_gradient": t.model_gradient,
                }
            )
            table.add_row(name, f"ZeRO-1 x{layout.shards}", str(micro), str(satellites), f"{t.star / 1e9:,.2f}",
                          f"{t.reduce_scatter / 1e9:,.2f}", f"{t.star / t.model_gradient:.0f}x",
                          f"{t.reduce_scatter / t.model_gradient:.2f}x")  # fmt: skip
    console.print(table)
    return rows


# ---- 3. Qwen3 on 8 x 80 GB cells ------------------------------------------------------------------------------
def smallest_fitting(shape: ModelShape, micro_tokens: int) -> CellLayout | None:
    """The layout of fewest 80 GB devices (then least model parallel) that fits ``micro_tokens``."""
    best: tuple[int, int, CellLayout] | None = None
    for tensor in (1, 2, 4, 8):
        for pipeline in (1, 2, 4, 8, 16):
            for shards in (1, 2, 4, 8, 16, 32):
                layout = CellLayout(
                    tensor=tensor, pipeline=pipeline, shards=shards, device_bytes=CELL_GB * GIB
                )
                if layout.devices % 8 or layout.devices > 512:
                    continue
                try:
                    fits = device_memory(shape, layout, BF16, micro_tokens).fits
                except ValueError:
                    continue
                key = (layout.devices, tensor * pipeline)
                if fits and (best is None or key < best[:2]):
                    best = (*key, layout)
    return best[2] if best else None


def projection_rows(shape: ModelShape, micro_tokens: int) -> list[tuple[str, CellLayout, Precision, Design]]:
    cell = CELL_GB * GIB
    rows: list[tuple[str, CellLayout, Precision, Design]] = [
        ("today: star, fp32 core (f64 sum)", CellLayout(tensor=8, device_bytes=cell), FP32, "star"),
        ("star, bf16 + fp32 master", CellLayout(tensor=8, device_bytes=cell), BF16, "star"),
        ("ZeRO-1 x8", CellLayout(shards=8, device_bytes=cell), BF16, "sharded"),
        ("TP2 x ZeRO-1 x4", CellLayout(tensor=2, shards=4, device_bytes=cell), BF16, "sharded"),
        (
            "TP2 x ZeRO-1 x4, fp32 grads",
            CellLayout(tensor=2, shards=4, device_bytes=cell),
            BF16_FP32_GRADS,
            "sharded",
        ),
        ("TP4 x ZeRO-1 x2", CellLayout(tensor=4, shards=2, device_bytes=cell), BF16, "sharded"),
        ("TP8", CellLayout(tensor=8, device_bytes=cell), BF16, "sharded"),
    ]
    if not any(device_memory(shape, lay, prec, micro_tokens, design=d).fits for _, lay, prec, d in rows):
        found = smallest_fitting(shape, micro_tokens)
        if found:
            label = f"smallest fit: TP{found.tensor} PP{found.pipeline} ZeRO x{found.shards}"
            rows.append((label, found, BF16, "sharded"))
    return rows


def projection_table(
    console: Console, shapes: dict[str, ModelShape], micro_tokens: int
) -> list[dict[str, Any]]:
    table = Table(title=f"Per-GPU GiB on 80 GB GPUs, micro-steps of {micro_tokens:,} tokens, activation "
                  f"checkpointing, flash attention; usable = 90% = {0.9 * CELL_GB:.0f} GiB")  # fmt: skip
    for col in ("model", "design / layout", "GPUs", *CATEGORIES, "total", "fits", "max micro tokens"):
        table.add_column(col, justify="right")
    out = []
    for name, shape in shapes.items():
        rows = projection_rows(shape, micro_tokens)
        for i, (label, layout, precision, design) in enumerate(rows):
            mem: DeviceMemory = device_memory(shape, layout, precision, micro_tokens, design=design)
            longest = max_micro_tokens(shape, layout, precision, design=design)
            table.add_row(
                name if i == 0 else "",
                label,
                str(layout.devices),
                *(gb(v) for v in mem.by_category().values()),
                gb(mem.total),
                "[green]yes[/]" if mem.fits else "[red]no[/]",
                f"{longest:,}",
                end_section=i == len(rows) - 1,
            )
            out.append({"model": name, "parameters": shape.parameters(),
                        "active_parameters": shape.parameters(active=True), "design": design, "label": label,
                        "precision": precision.name, "tensor": layout.tensor, "pipeline": layout.pipeline,
                        "shards": layout.shards, "devices": layout.devices, "bytes": mem.by_category(),
                        "total": mem.total, "usable": mem.usable_bytes, "fits": mem.fits,
                        "max_micro_tokens": longest})  # fmt: skip
    console.print(table)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--micro-tokens", type=int, default=65536, help="tokens per micro-step in the projection"
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4], help="the measured cells' sizes")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per micro-step in the measured cells")
    parser.add_argument(
        "--no-measure", action="store_true", help="skip the measured tables (no torch needed)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "memory.json")
    args = parser.parse_args()
    if args.ranks[0] != 1:
        parser.error("--ranks must start with 1: the 1-rank cell is what the others are compared with")
    console = Console(width=None if sys.stdout.isatty() else 200)  # a file or a pipe gets whole tables
    result: dict[str, Any] = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                              "micro_tokens": args.micro_tokens, "assumptions": list(ASSUMPTIONS)}  # fmt: skip
    local: dict[str, ModelShape] = {}
    if not args.no_measure:
        import torch

        from gyre.engine.models import init_model

        result["torch"] = torch.__version__
        with tempfile.TemporaryDirectory() as tmp_dir, Progress(console=console, transient=True) as progress:
            tmp = Path(tmp_dir)
            task = progress.add_task("one-process core (TrainState)", total=2)
            small = init_model(tmp / "small", preset="small")
            medium = write_medium(tmp / "medium-150m", small)
            dirs = {"small": small, "~150M": medium}
            runs = {}
            for name, directory in dirs.items():
                runs[name] = measure(directory)
                progress.advance(task)
            cells = measure_cells(dirs, args.ranks, args.tokens, progress)
        result["measured"] = measured_table(console, runs)
        rows = cell_rows(cells)
        cell_tables(console, rows)
        result["cells"] = {"bucket_mib": CELL_BUCKET_MIB, "steps": CELL_STEPS, "rows": rows, "raw": cells}
        local = {name: ModelShape.from_config(run["config"]) for name, run in runs.items()}
    shapes = {name: ModelShape.from_config(config) for name, config in QWEN3.items()}
    result["traffic"] = traffic_table(console, local | shapes)
    result["projection"] = projection_table(console, shapes, args.micro_tokens)
    console.print("[bold]Assumptions[/]")
    for line in ASSUMPTIONS:
        console.print(line, markup=False, highlight=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Training-cell memory: today's core measured against the accounting model, then Qwen3 on 8 x 80 GB cells.

    python benchmarks/memory.py [--micro-tokens 65536] [--no-measure]

Prints four tables and writes ``benchmarks/results/memory.json``:
1. measured vs predicted: a real ``TrainState`` (today's core, one process, fp32, float64 step sum) of the ``small``
   preset and of a ~150 M-parameter Qwen3 (written here from a config, no download), each in its own process after
   one AdamW update and one micro-step's backward: weights, gradients and AdamW bytes counted from the tensors, next
   to ``gyre.train.memory``'s prediction for one rank, and the process's peak RSS;
2. gradient bytes into any one process per step: today's star (every remote micro-step's whole fp32 gradient into
   the core) against one bucketed reduce-scatter per step (ZeRO-1), for several micro-step and member counts;
3. Qwen3-8B, Qwen3-32B and Qwen3-235B-A22B on 8 x 80 GB cells: per-GPU bytes by category, fits or not, and the
   longest micro-step that fits, for today's design and sharded layouts (plus the smallest multi-cell layout that
   holds the MoE);
4. the assumptions of the model (``gyre.train.memory.ASSUMPTIONS``).
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
    parser.add_argument("--no-measure", action="store_true", help="skip the measured table (no torch needed)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "memory.json")
    args = parser.parse_args()
    console = Console()
    result: dict[str, Any] = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                              "micro_tokens": args.micro_tokens, "assumptions": list(ASSUMPTIONS)}  # fmt: skip
    local: dict[str, ModelShape] = {}
    if not args.no_measure:
        import torch

        from gyre.models import init_model

        result["torch"] = torch.__version__
        with tempfile.TemporaryDirectory() as tmp_dir:
            tmp = Path(tmp_dir)
            small = init_model(tmp / "small", preset="small")
            medium = write_medium(tmp / "medium-150m", small)
            runs = {"small": measure(small), "~150M": measure(medium)}
        result["measured"] = measured_table(console, runs)
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

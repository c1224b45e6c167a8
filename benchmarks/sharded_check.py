"""The sharded core's state on one device against the one-process core: ``gpu_check.py``'s ``sharded`` phase.

    python benchmarks/sharded_check.py [--device cuda|cpu] [--json FILE]

A 1-rank group (NCCL on ``cuda``, gloo on ``cpu``; one GPU cannot host two NCCL ranks) holds a
``gyre.train.sharded.ShardedState`` of a ``tiny`` model whose replica lives on the device; two steps of micro-steps
are computed on that replica, each micro-step's gradient reduce-scattered into the shard in buckets (small enough
that there are several) and added, the same values, to a ``TrainState`` on the CPU; after each ``apply`` (AdamW on
the shard, weights all-gathered bucket by bucket into the replica) the two updates must agree within 1e-6 and the
gradient norms within 1e-6 relative. Prints the rank's bytes (``statistics()``) and writes the figures as JSON; exits
1 when they disagree.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import torch
import torch.distributed as dist

MICRO_STEPS = 3  # per step
STEPS = 2
BUCKET_MIB = 1.0  # float64 per reduce-scatter call: several buckets for the tiny model
TOLERANCE = 1e-6


def check(device: str) -> dict[str, Any]:
    """The figures of one run (see the module); ``ok`` says whether the updates agree."""
    from transformers.utils import logging as hf_logging

    from gyre.config import TrainerConfig
    from gyre.engine.launcher import free_port
    from gyre.engine.models import init_model
    from gyre.train.sharded import ShardedState
    from gyre.train.state import TrainState, flat_gradient, load_model, lr_at

    hf_logging.disable_progress_bar()
    backend = "nccl" if device == "cuda" else "gloo"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    options: dict[str, Any] = {"device_id": torch.device("cuda", 0)} if device == "cuda" else {}
    dist.init_process_group(backend, rank=0, world_size=1, **options)
    figures: dict[str, Any] = {"backend": backend, "device": device}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = init_model(Path(tmp) / "tiny", preset="tiny", seed=0)
            cfg = TrainerConfig(model_path=str(model_dir), learning_rate=1e-3, weight_decay=0.1)
            reference = TrainState(cfg)  # today's core: one process, CPU
            model = load_model(model_dir).to(device)  # the replica the rank computes on
            state = ShardedState(model, cfg, bucket_mib=BUCKET_MIB)
            figures.update(parameters=state.numel, buckets=-(-state.shard_numel // state.bucket_numel))
            worst_update, worst_norm, started = 0.0, 0.0, time.perf_counter()
            for step in range(STEPS):
                before_ref, before = reference.flat.clone(), state.flat.detach().cpu().clone()
                for index in range(MICRO_STEPS):
                    generator = torch.Generator().manual_seed(1000 * step + index)
                    ids = torch.randint(
                        0, int(model.config.vocab_size), (1, 8 + 7 * index), generator=generator
                    )
                    ids = ids.to(device)
                    (model(input_ids=ids, labels=ids).loss / MICRO_STEPS).backward()
                    gradient = flat_gradient(model)
                    model.zero_grad(set_to_none=True)
                    require(gradient.is_cuda == (device == "cuda"), f"a gradient on {gradient.device}")
                    state.reduce_scatter(gradient)  # bucketed, on the device's tensors
                    reference.add(gradient.cpu())
                norm = state.apply(lr_at(cfg, step))  # bucketed all-gather into the replica
                ref_norm, _ = reference.apply()
                update = state.flat.detach().cpu() - before
                ref_update = reference.flat - before_ref
                worst_update = max(worst_update, float((update - ref_update).abs().max()))
                worst_norm = max(worst_norm, abs(norm - ref_norm) / ref_norm)
                figures[f"update_max_abs_{step}"] = float(ref_update.abs().max())
            if device == "cuda":
                torch.cuda.synchronize()
                figures["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
            figures.update(seconds=time.perf_counter() - started, update_max_abs_diff=worst_update,
                           norm_max_rel_diff=worst_norm, statistics=msgspec.to_builtins(state.statistics()))  # fmt: skip
            figures["ok"] = worst_update <= TOLERANCE and worst_norm <= TOLERANCE
    finally:
        dist.destroy_process_group()
    return figures


def require(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu"
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("sharded_check: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    figures = check(args.device)
    stats = figures["statistics"]
    print(f"{figures['backend']} on {figures['device']}, 1 rank, {figures['parameters']:,} parameters, "
          f"{figures['buckets']} buckets: update max |diff| {figures['update_max_abs_diff']:.3g}, "
          f"norm rel diff {figures['norm_max_rel_diff']:.3g} ({'ok' if figures['ok'] else 'NOT EQUAL'})")  # fmt: skip
    print("rank 0 bytes: " + ", ".join(f"{k} {v:,}" for k, v in stats.items() if k.endswith("_bytes")))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

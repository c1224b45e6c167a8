"""Ranks of a core cell over gloo that save and load a ZeRO-1 optimizer state with ``gyre.train.checkpoint``
(`tests/integration/train/test_checkpoint_resharding.py`): each rank is its own process (``torch.multiprocessing``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from gyre.train.checkpoint import flat_range, load_flat_state, save_checkpoint

LR, BETAS, EPS, WEIGHT_DECAY = 1e-2, (0.9, 0.999), 1e-8, 0.01


def adamw(params: list[torch.Tensor]) -> torch.optim.AdamW:
    """The optimizer of the reference and of every shard: single-tensor kernel, elementwise, so a flat shard steps
    exactly as the parameters do one by one."""
    return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, foreach=False)


def gathered(
    shapes: dict[str, list[int]], mine: torch.Tensor, numel: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each parameter's weights gathered from every rank's ``flat_range`` of the master weights just in time (one
    all-reduce of the parameter's size: each rank adds the part it holds), as a sharded core's export would."""
    rank, world = dist.get_rank(), dist.get_world_size()
    start, stop = flat_range(numel, rank, world)
    at = 0
    for name, shape in shapes.items():
        size = torch.Size(shape).numel()
        full = torch.zeros(size)
        lo, hi = max(at, start), min(at + size, stop)
        if lo < hi:
            full[lo - at : hi - at] = mine[lo - start : hi - start]
        dist.all_reduce(full)  # x + 0 = x: exact
        yield name, full.view(shape)
        at += size


def run_rank(rank: int, world: int, port: int, mode: str, reference: str, checkpoint: str, out: str) -> None:
    """``save``: a whole checkpoint from this rank's ``flat_range`` of the reference state (its weights gathered
    tensor by tensor, its optimizer state sharded) into ``checkpoint``. ``load``: this rank's range
    from ``checkpoint`` (saved by any number of ranks), then one AdamW step on it with the reference's next
    gradient; writes both to ``out``."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # a rank that misses a collective fails the others after the timeout, rather than hanging the test
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        whole = load_file(reference)
        numel = whole["master"].numel()
        start, stop = flat_range(numel, rank, world)
        if mode == "save":
            from transformers import PretrainedConfig

            keys = ("master", "exp_avg", "exp_avg_sq", "step")
            mine = {k: whole[k][start:stop].clone() if whole[k].dim() else whole[k] for k in keys}
            with safe_open(reference, framework="pt") as f:  # in the flat layout's order
                names = json.loads(f.metadata()["parameters"])
            shapes = {name: list(whole[f"param.{name}"].shape) for name in names}
            state = {"step": 3, "version": 3, "parameters": list(shapes)}
            save_checkpoint(checkpoint, config=PretrainedConfig(), source=Path(reference).parent,
                            tensors=gathered(shapes, mine["master"], numel), flat=mine, numel=numel, state=state,
                            group=dist.group.WORLD, max_shard_bytes=2**17)  # fmt: skip
            return
        loaded = load_flat_state(checkpoint, numel, group=dist.group.WORLD)
        result = {f"loaded.{k}": v.clone() for k, v in loaded.items()}
        if "exp_avg" in loaded:
            master = torch.nn.Parameter(loaded["master"])
            optimizer = adamw([master])
            optimizer.state[master] = {k: loaded[k] for k in ("step", "exp_avg", "exp_avg_sq")}
            master.grad = whole["next_grad"][start:stop].clone()
            optimizer.step()
            result |= {"stepped.master": master.detach()} | {
                f"stepped.{k}": v for k, v in optimizer.state[master].items()
            }
        save_file({k: v.contiguous() for k, v in result.items()}, str(Path(out) / f"rank-{rank}.safetensors"))
    finally:
        dist.destroy_process_group()

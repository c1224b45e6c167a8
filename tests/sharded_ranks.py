"""A core cell of ranks over gloo that trains the tiny model with ``ShardedState``, and the micro-steps they compute
(`tests/integration/train/test_sharded_state.py`): each rank runs as its own process (``torch.multiprocessing``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gyre.config import TrainerConfig

MICRO_STEPS = 6  # per step
# plan[step][rank]: the micro-steps (0..MICRO_STEPS-1) a rank computes in that step, in this order
Plan = list[list[list[int]]]


def trainer_config(model_dir: Path, clip: float) -> TrainerConfig:
    """A config whose updates are 100x the default's, with weight decay, a warm-up and ``clip`` (0: none)."""
    return TrainerConfig(
        model_path=str(model_dir),
        learning_rate=1e-3,
        lr_warmup_steps=2,
        weight_decay=0.1,
        grad_clip_norm=clip,
    )


def micro_gradient(model: Any, step: int, index: int) -> torch.Tensor:
    """The flat gradient of micro-step ``index`` of ``step`` at ``model``'s weights (its ``.grad`` is cleared)."""
    from gyre.train.state import flat_gradient

    generator = torch.Generator().manual_seed(1000 * step + index)
    ids = torch.randint(0, int(model.config.vocab_size), (1, 6 + 5 * index), generator=generator)
    (model(input_ids=ids, labels=ids).loss / MICRO_STEPS).backward()
    gradient = flat_gradient(model)
    model.zero_grad(set_to_none=True)
    return gradient


def run_rank(
    rank: int, world: int, port: int, model_dir: str, clip: float, mode: str, plan: Plan, out: str
) -> None:
    """One rank: two steps by ``plan``, gradients reduced by ``mode`` (``accumulate``: a local sum reduced once a
    step; ``direct``: a reduce-scatter per micro-step round); writes its replica's weights and its statistics."""
    from safetensors.torch import save_file

    from gyre.train.sharded import ShardedState
    from gyre.train.state import load_model, lr_at

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cfg = trainer_config(Path(model_dir), clip)
        state = ShardedState(load_model(model_dir), cfg, bucket_mib=0.25)  # several buckets for a 1.7 M model
        figures: dict[str, Any] = {}
        for step, (assignment, how) in enumerate(zip(plan, mode.split("+"), strict=True)):
            mine = assignment[rank]
            if how == "accumulate":
                for index in mine:
                    state.accumulate(micro_gradient(state.model, step, index))
                figures["local_bytes_before_reduce"] = state.statistics().local_bytes
                state.reduce()
            elif how == "direct":
                for round_ in range(max(len(a) for a in assignment)):
                    index = mine[round_] if round_ < len(mine) else None
                    state.reduce_scatter(None if index is None else micro_gradient(state.model, step, index))
            else:  # "owned": each micro-step's gradient goes to its owners rank to rank, as a satellite's would
                _send_to_owners(state, step, assignment)
            lr = lr_at(cfg, step)
            figures[f"norm_{step}"] = state.apply(lr)
        figures["statistics"] = json.loads(json.dumps(state.statistics(), default=_builtins))
        save_file({"flat": state.flat.detach().clone()}, f"{out}/rank-{rank}.safetensors")
        Path(f"{out}/rank-{rank}.json").write_text(json.dumps(figures))
    finally:
        dist.destroy_process_group()


def _send_to_owners(state: Any, step: int, assignment: list[list[int]]) -> None:
    """Every rank's micro-steps, one by one in rank order: its owner's slice to each other rank (send/recv)."""
    from gyre.train.sharded import shard_bounds

    bounds = shard_bounds(state.numel, state.world)
    for source, indices in enumerate(assignment):
        for index in indices:
            if state.rank == source:
                gradient = micro_gradient(state.model, step, index)
                for owner, (start, end) in enumerate(bounds):
                    if owner == source:
                        state.add_owned(start, gradient[start:end])
                    elif end > start:
                        dist.send(gradient[start:end].contiguous(), dst=owner)
            elif state.end > state.start:
                piece = torch.empty(state.end - state.start)
                dist.recv(piece, src=source)
                state.add_owned(state.start, piece)


def _builtins(value: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(value)

"""A sharded core cell measured for ``benchmarks/memory.py``: N ranks, each its own process over gloo, each holding
a ``ShardedState`` (1/N of the fp32 master weights, float64 gradient sum and AdamW moments, a whole replica).

A step, on every rank, as the wired core does (``gyre.train.corecell``), in one of two modes:
- ``step`` (``trainer.gradient_accumulation = "float64"``, the cell's default over gloo): ``micro_per_rank``
  micro-steps of ``tokens`` tokens computed by the real objective (``compute_gradients``), each gradient added to
  the rank's local float64 sum, then one reduction (``ShardedState.reduce``, a ring over gloo);
- ``round`` (``"rounds"``, what the cell did before): each micro-step's gradient reduced at once
  (``reduce_scatter``: no whole-model sum on any rank);
then ``apply`` (global norm, AdamW on the shard, weights all-gathered into every replica).

Measured per rank: ``statistics()`` (bytes from the tensors; the bytes its TCP sockets sent during the reductions
and the gathers, from the kernel's ``TCP_INFO``: ``gyre.train.wire``), peak RSS (``ru_maxrss``) and each step's wall
(from a barrier to the end of ``apply``).
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def micro_step(step: int, rank: int, round_: int, tokens: int) -> Any:
    """One packed row of ``tokens`` tokens, different for every (step, rank, round)."""
    from gyre.protocol import MicroStep

    generator = torch.Generator().manual_seed(10_000 * step + 100 * rank + round_)
    ids = torch.randint(0, 256, (tokens,), generator=generator).tolist()
    n = tokens
    return MicroStep(input_ids=ids, position_ids=list(range(n)), parents=[-1, *range(n - 1)],
                     weights=[0.0] + [1 / (n - 1)] * (n - 1), advantages=[1.0] * n,
                     behaviour_logprobs=[-5.0] * n, versions=[0] * n, sequences=1)  # fmt: skip


def run_rank(
    rank: int, world: int, port: int, model_dir: str, micro_per_rank: int, tokens: int, steps: int,
    bucket_mib: float, mode: str, out: str,
) -> None:  # fmt: skip
    """One rank of the cell: ``steps`` steps in ``mode`` (see the module); writes ``out/rank-<rank>.json``."""
    from msgspec import to_builtins
    from transformers.utils import logging as hf_logging

    from gyre.config import TrainerConfig
    from gyre.train.objective import compute_gradients
    from gyre.train.sharded import ShardedState
    from gyre.train.state import flat_gradient, load_model, lr_at

    torch.set_num_threads(1)  # 4 ranks time-share 2 cores here; one thread each keeps them from thrashing
    hf_logging.disable_progress_bar()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cfg = TrainerConfig(model_path=model_dir)
        model = load_model(model_dir)
        state = ShardedState(model, cfg, bucket_mib=bucket_mib)
        figures: dict[str, Any] = {
            "rank": rank,
            "world": world,
            "numel": state.numel,
            "steps": [],
            "config": model.config.to_dict(),
        }
        for step in range(steps):
            dist.barrier()
            before = state.statistics()
            started = time.perf_counter()
            for round_ in range(micro_per_rank):
                compute_gradients(model, micro_step(step, rank, round_, tokens), cfg.loss, step)
                gradient = flat_gradient(model)
                model.zero_grad(set_to_none=True)
                if mode == "round":
                    state.reduce_scatter(gradient)
                else:
                    state.accumulate(gradient)
                del gradient
            local = state.statistics().local_bytes
            if mode == "step":
                state.reduce()
            reduced_at = time.perf_counter()
            norm = state.apply(lr_at(cfg, step))
            ended = time.perf_counter()
            after = state.statistics()
            figures["steps"].append({
                "wall_s": ended - started, "reduce_s": reduced_at - started, "apply_s": ended - reduced_at,
                "norm": norm, "local_bytes": local, "reductions": after.reductions - before.reductions,
                "reduce_socket_bytes": after.reduce_wire_bytes - before.reduce_wire_bytes,
                "apply_socket_bytes": after.gather_wire_bytes - before.gather_wire_bytes,
                "reduced_bytes": after.reduced_bytes - before.reduced_bytes,
                "gathered_bytes": after.gathered_bytes - before.gathered_bytes,
            })  # fmt: skip
        figures["statistics"] = to_builtins(state.statistics())
        figures["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        Path(out, f"rank-{rank}.json").write_text(json.dumps(figures))
    finally:
        dist.destroy_process_group()


def run_cell(
    model_dir: Path,
    world: int,
    micro_per_rank: int,
    tokens: int,
    steps: int,
    bucket_mib: float,
    mode: str = "step",
) -> list[dict[str, Any]]:
    """Every rank's figures (rank order) from a cell of ``world`` ranks in ``mode``, each a fresh process."""
    import tempfile

    import torch.multiprocessing as mp

    from gyre.engine.launcher import free_port

    with tempfile.TemporaryDirectory() as out:
        args = (world, free_port(), str(model_dir), micro_per_rank, tokens, steps, bucket_mib, mode, out)
        mp.spawn(run_rank, args=args, nprocs=world, join=True)
        return [json.loads(Path(out, f"rank-{r}.json").read_text()) for r in range(world)]

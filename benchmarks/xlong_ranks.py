"""A context-parallel group measured for ``benchmarks/xlong.py`` (parts b and c): N ranks over gloo, each a fresh
process, computing one micro-step together (`gyre.train.context`; one rank computes it whole with
`gyre.train.objective`, today's path), then summing the gradient and taking an AdamW step.

Measured per rank and stage: wall seconds, and peak resident memory above the rank's baseline: ``ru_maxrss`` (the
process's high-water mark) after the stage minus its value once the model and the micro-step are loaded. A stage's
figure is the high-water mark up to its end, so it covers the stages before it too; what the loaded model and
micro-step hold is not in it. Stages:
  forward+backward  ``compute_gradients`` from a barrier (every rank starts together) to the rank's end
  all-reduce        the gradient summed over the ranks (the micro-step's gradient; none with one rank)
  optimizer         one AdamW update of the summed gradient
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def chain_micro_step(tokens: int, vocab: int, call_tokens: int = 700, out_tokens: int = 100) -> Any:
    """One chain of ``tokens`` tokens laid out as an agent's calls: of every ``call_tokens``, the last
    ``out_tokens`` were sampled and carry the loss (weights summing to 1), the rest are the call's new input."""
    from gyre.protocol import MicroStep

    generator = torch.Generator().manual_seed(tokens)
    ids = torch.randint(0, vocab, (tokens,), generator=generator).tolist()
    sampled = [i > 0 and i % call_tokens >= call_tokens - out_tokens for i in range(tokens)]
    weight = 1.0 / max(1, sum(sampled))
    behaviour = -float(torch.tensor(vocab).log())  # a uniform sampler: ratios near 1
    return MicroStep(input_ids=ids, position_ids=list(range(tokens)), parents=[-1, *range(tokens - 1)],
                     weights=[weight if s else 0.0 for s in sampled], advantages=[1.0] * tokens,
                     behaviour_logprobs=[behaviour] * tokens, versions=[0] * tokens, sequences=1)  # fmt: skip


def _high_water_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_rank(
    rank: int, world: int, port: int, model_dir: str, micro_path: str, optimizer: bool, out: str
) -> None:
    """One rank: the stages of the module; writes ``out/rank-<rank>.json``."""
    import msgspec
    from transformers.utils import logging as hf_logging

    from gyre.config import LossConfig
    from gyre.protocol import MicroStep
    from gyre.train import context, objective
    from gyre.train.state import flat_gradient, load_model

    torch.set_num_threads(
        1
    )  # ranks time-share this machine's cores; one thread each keeps them from thrashing
    hf_logging.disable_progress_bar()
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = load_model(model_dir)
        micro = msgspec.msgpack.decode(Path(micro_path).read_bytes(), type=MicroStep)
        baseline = _high_water_mb()
        stages: list[dict[str, Any]] = []

        def done(stage: str, started: float) -> None:
            stages.append({"stage": stage, "seconds": time.perf_counter() - started,
                           "peak_mb": _high_water_mb() - baseline})  # fmt: skip

        if world > 1:
            dist.barrier()
        started = time.perf_counter()
        if world > 1:
            stats = context.compute_gradients(model, micro, LossConfig(), 0, dist.group.WORLD)
        else:
            stats = objective.compute_gradients(model, micro, LossConfig(), 0)
        done("forward+backward", started)
        figures: dict[str, Any] = {"rank": rank, "loss": stats.loss, "scored": stats.tokens,
                                   "computed_tokens": stats.computed_tokens}  # fmt: skip
        if optimizer:
            started = time.perf_counter()
            gradient = flat_gradient(model)
            if world > 1:
                dist.all_reduce(gradient)
                done("all-reduce", started)
                started = time.perf_counter()
            offset = 0
            for p in model.parameters():
                p.grad = gradient[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
            torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=False).step()
            done("optimizer", started)
        figures |= {"baseline_mb": baseline, "stages": stages}
        Path(out, f"rank-{rank}.json").write_text(json.dumps(figures))
    finally:
        if world > 1:
            dist.destroy_process_group()


def run_group(model_dir: Path, micro: Any, world: int, optimizer: bool) -> list[dict[str, Any]]:
    """Every rank's figures (rank order) from ``world`` fresh processes computing ``micro`` together."""
    import msgspec
    import torch.multiprocessing as mp

    from gyre.engine.launcher import free_port

    with tempfile.TemporaryDirectory() as out:
        path = Path(out, "micro.msgpack")
        path.write_bytes(msgspec.msgpack.encode(micro))
        args = (world, free_port(), str(model_dir), str(path), optimizer, out)
        mp.start_processes(run_rank, args=args, nprocs=world, join=True, start_method="spawn")
        return [json.loads(Path(out, f"rank-{r}.json").read_text()) for r in range(world)]

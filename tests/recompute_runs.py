"""Micro-steps with and without activation checkpointing (`tests/unit/train/test_activation_checkpointing.py`,
`tests/integration/train/test_linear_memory.py`): models built here, ranks of a context-parallel group, and the peak
memory of one micro-step (forward and backward of the policy loss) measured in a fresh process.

CPU torch keeps no allocator statistics, so the figure is the process's resident set: its high-water mark during the
step (Linux ``VmHWM``, reset at the step's start through ``/proc/self/clear_refs``) less its size when the step
starts, the model and the micro-step already built and one small step already run (so lazily built kernels, thread
pools and gradient buffers are in the baseline). A fresh process per figure: no allocator state carries over.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

import torch
import torch.distributed as dist

from context_ranks import tree_micro_step
from gyre.config import LossConfig
from gyre.engine.models import PRESETS


def model(preset: str, vocab: int, layers: int | None = None, seed: int = 0) -> Any:
    """A randomly initialised Qwen3 model of ``preset``'s shape with a ``vocab``-token vocabulary (built here, no
    files), in training mode."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    arch = dict(PRESETS[preset])
    theta = arch.pop("rope_theta")
    arch["vocab_size"] = vocab
    if layers is not None:
        arch["num_hidden_layers"] = layers
    config = Qwen3Config(**arch, rope_parameters={"rope_type": "default", "rope_theta": theta})
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).train()


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _measure(
    preset: str, vocab: int, layers: int | None, tokens: int, branches: int, checkpointing: bool
) -> dict:
    from gyre.train import recompute
    from gyre.train.objective import compute_gradients

    torch.set_num_threads(1)
    m = model(preset, vocab, layers)
    if checkpointing:
        recompute.enable(m)
    compute_gradients(m, tree_micro_step(1, 256, 2, vocab), LossConfig(), 0)  # warm-up; its gradients stay
    micro = tree_micro_step(tokens, tokens, branches, vocab)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark restarts from the present resident set
    base = _status_kib("VmRSS")
    start = time.perf_counter()
    compute_gradients(m, micro, LossConfig(), 0)
    wall = time.perf_counter() - start
    peak = _status_kib("VmHWM")
    return {"peak_bytes": (peak - base) * 1024, "process_peak_bytes": peak * 1024, "wall_s": wall}


def step_peak(
    tokens: int, *, branches: int = 8, checkpointing: bool, preset: str = "micro", vocab: int = 1024,
    layers: int | None = None,
) -> dict:  # fmt: skip
    """One micro-step of a ``tokens``-token tree with ``branches`` branches in a fresh process: ``peak_bytes``, its
    peak above the process's size at its start (see the module); ``process_peak_bytes``, the process's peak resident
    set during it (runtime, model and state included); ``wall_s``."""
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(_measure, preset, vocab, layers, tokens, branches, checkpointing).result()


def run_rank(rank: int, world: int, port: int, micro_json: str, out: str) -> None:
    """One rank of a context-parallel group: the micro-step's forward and backward on the tiny shape, without and
    then with activation checkpointing; rank 0 writes each loss and gradient summed over ranks."""
    import json

    import msgspec

    from gyre.protocol import MicroStep
    from gyre.train import context, recompute
    from gyre.train.state import flat_gradient

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        micro = msgspec.json.decode(micro_json, type=MicroStep)
        losses = []
        for checkpointing in (False, True):
            m = model("tiny", 1024, 2)
            if checkpointing:
                recompute.enable(m)
            stats = context.compute_gradients(m, micro, LossConfig(), 0, dist.group.WORLD)
            gradient = flat_gradient(m).double()
            figures = torch.tensor([stats.loss], dtype=torch.float64)
            dist.all_reduce(gradient)
            dist.all_reduce(figures)
            losses.append(float(figures[0]))
            if rank == 0:
                torch.save(gradient, f"{out}/gradient-{int(checkpointing)}.pt")
        if rank == 0:
            with open(f"{out}/losses.json", "w") as f:
                json.dump(losses, f)
    finally:
        dist.destroy_process_group()

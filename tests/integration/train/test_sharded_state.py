"""A core cell of 2 and 4 ranks over gloo holding the training state in shards (``ShardedState``): two steps give the
one-process ``TrainState``'s weights, whichever rank computed which micro-step and in what order, and each rank holds
1/N of the gradient sum and of the optimizer state."""

from __future__ import annotations

import itertools
import json
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from gyre.train.state import TrainState
from sharded_ranks import MICRO_STEPS, Plan, micro_gradient, run_rank, trainer_config

TOLERANCE = 1e-6  # fp32, absolute, on every weight, where the update is clipped (see CELLS)


class Reference:
    """One process computing every micro-step in order, as the core does today, and what it holds."""

    def __init__(self, model_dir: Path, clip: float, steps: int = 2) -> None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as the ranks: the same gradients, bit for bit, at the same weights
        try:
            state = TrainState(trainer_config(model_dir, clip))
            self.norms = []  # each step's gradient norm, in float64
            for step in range(steps):
                for index in range(MICRO_STEPS):
                    state.add(micro_gradient(state.model, step, index))
                self.norms.append(float(torch.linalg.vector_norm(state.gradient_sum)))
                state.apply()
        finally:
            torch.set_num_threads(threads)
        self.weights = state.flat
        self.optimizer_bytes = sum(
            v.numel() * v.element_size()
            for entry in state.optimizer.state.values()
            for v in entry.values()
            if isinstance(v, torch.Tensor)
        )
        self.gradient_bytes = state.gradient_sum.numel() * state.gradient_sum.element_size()


def _cell(
    model_dir: Path, world: int, clip: float, mode: str, plan: Plan, out: Path
) -> list[tuple[torch.Tensor, Any]]:
    """Run the ranks to the end; each rank's replica weights and figures."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out.mkdir()
    mp.start_processes(
        run_rank,
        args=(world, port, str(model_dir), clip, mode, plan, str(out)),
        nprocs=world,
        start_method="forkserver",
    )
    return [
        (load_file(out / f"rank-{r}.safetensors")["flat"], json.loads((out / f"rank-{r}.json").read_text()))
        for r in range(world)
    ]


# (world, gradient clip, how gradients reach the shards, plan[step][rank]): even and uneven splits, reversed orders,
# idle ranks; "owned": each gradient goes to its owners rank to rank (``add_owned``, a satellite's way). Unclipped, the update is the one process's bit for bit; clipped, the one process's norm (fp32 per
# parameter) and the shards' (float64) differ by ~3e-7 relative, which moves a few weights by a few 1e-7 by step 2
CELLS = [
    (2, 0.0, "accumulate+owned", [[[0, 2, 4], [1, 3, 5]], [[5, 4, 3, 2], [1, 0]]]),
    (4, 0.5, "accumulate+accumulate", [[[5, 4, 3, 2], [], [1], [0]], [[0], [1], [2], [5, 4, 3]]]),
    (4, 0.5, "direct+direct", [[[0, 4], [1, 5], [2], [3]], [[3], [], [5, 0, 1], [4, 2]]]),
]


@pytest.mark.slow(reason="spawns 10 rank processes over gloo, each importing transformers (~60 s on 2 cores)")
def test_sharded_cell_steps_as_one_process(tiny_model: Path, tmp_path: Path) -> None:
    references = {clip: Reference(tiny_model, clip) for clip in {c for _, c, _, _ in CELLS}}
    for world, clip, mode, plan in CELLS:
        reference = references[clip]
        ranks = _cell(tiny_model, world, clip, mode, plan, tmp_path / f"{world}-{mode}")
        for rank, (weights, figures) in enumerate(ranks):
            where = f"{world} ranks, {mode}, rank {rank}"
            assert torch.equal(weights, ranks[0][0]), f"{where}: replicas disagree"
            if clip == 0:
                assert torch.equal(weights, reference.weights), f"{where}: not the one process's update"
            err = float((weights - reference.weights).abs().max())
            assert err <= TOLERANCE, f"{where}: weights differ from one process by {err:.3g}"
            for step, norm in enumerate(reference.norms):
                assert figures[f"norm_{step}"] == pytest.approx(norm, rel=1e-6)
            stats = figures["statistics"]
            share = {
                "optimizer": reference.optimizer_bytes / world,
                "gradient": reference.gradient_bytes / world,
            }
            for kind, ideal in share.items():
                held = stats[f"{kind}_bytes"]
                assert abs(held - ideal) <= 0.05 * ideal, f"{where}: {kind} {held} B for 1/N = {ideal:.0f} B"
            assert stats["local_bytes"] == 0  # the local sum is freed by reduce (and never made by direct)
            if mode.endswith("+accumulate") and plan[1][rank]:
                assert figures["local_bytes_before_reduce"] == 8 * reference.weights.numel()
        bounds = [(f["statistics"]["start"], f["statistics"]["end"]) for _, f in ranks]
        assert bounds[0][0] == 0 and bounds[-1][1] == reference.weights.numel()
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds)), "ranges do not partition"

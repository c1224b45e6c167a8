"""A ``gpu_check`` phase (issue 57, item 7): `gyre.train.attention.segment_attention`'s CUDA branch and a
context-parallel micro-step through it, on a GPU, against the CPU path.

``run()`` returns the figures (or raises saying what differed):
  tree        a 4,096-token tree with branches, 4 query heads a key/value head, fp32: the CUDA branch (one
              FlexAttention call, its block mask built from the segments) against the CPU per-range flash path,
              output and the query, key and value gradients; then bf16 against the same fp32 reference
  blocks      the ring's block primitives on CUDA (FlexAttention forward, backward by recomputation) against the
              CPU flash kernel's: two key ranges merged, output and gradients
  context     the tiny model's micro-step (a 2,048-token tree) on min(2, GPUs) NCCL ranks through
              `gyre.train.context` (ring attention, the CUDA block primitives) against one CPU process computing it
              whole: loss and gradient

    python benchmarks/gpu_attention_check.py    # prints the figures as JSON
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FP32_TOLERANCE = 1e-4  # relative to the largest magnitude, TF32 off
BF16_TOLERANCE = 3e-2


def _tree(n: int, seed: int, branch: float = 0.02) -> list[int]:
    rng = random.Random(seed)
    return [-1] + [i - 1 if rng.random() > branch else rng.randrange(i) for i in range(1, n)]


def _worst(got: Any, want: Any) -> float:
    """Largest difference relative to the reference's largest magnitude."""
    return float(
        (got.double().cpu() - want.double().cpu()).abs().max() / want.double().abs().max().clamp_min(1e-30)
    )


def _tree_phase() -> dict[str, Any]:
    import torch

    from gyre.train.attention import segment_attention
    from gyre.train.loss import tree_segments

    torch.manual_seed(0)
    parents = _tree(4096, 0)
    segments = tree_segments(parents)
    shapes = ((1, 8, 4096, 64), (1, 2, 4096, 64), (1, 2, 4096, 64))
    base = [torch.randn(s) for s in shapes]
    weights = torch.randn(shapes[0])

    def grads(device: str, dtype: Any) -> tuple[Any, list[Any], float]:
        q, k, v = (t.to(device, dtype).requires_grad_() for t in base)
        start = time.perf_counter()
        out = segment_attention(q, k, v, segments)
        (out.float() * weights.to(device)).sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        return out, [t.grad for t in (q, k, v)], time.perf_counter() - start

    want, want_grads, cpu_s = grads("cpu", torch.float32)
    figures: dict[str, Any] = {"tokens": len(parents), "segments": len(segments), "cpu_s": cpu_s}
    for name, dtype, bound in (
        ("fp32", torch.float32, FP32_TOLERANCE),
        ("bf16", torch.bfloat16, BF16_TOLERANCE),
    ):
        grads("cuda", dtype)  # compile first
        out, got, seconds = grads("cuda", dtype)
        worst = max(_worst(out, want), *(_worst(g, w) for g, w in zip(got, want_grads, strict=True)))
        figures[name] = {"worst_relative": worst, "cuda_s": seconds, "bound": bound}
        if worst > bound:
            raise AssertionError(f"segment_attention's CUDA branch in {name}: {worst:.2e} > {bound:.0e}")
    return figures


def _blocks_phase() -> dict[str, Any]:
    import torch

    from gyre.train.attention import attend, attend_backward, merge

    torch.manual_seed(1)
    q = torch.randn(1, 8, 512, 64)
    k, v = (torch.randn(1, 2, 1536, 64) for _ in range(2))
    grad = torch.randn(1, 8, 512, 64)
    spans = (((1024, 1536), True), ((0, 1024), False))  # its own block causal, then an earlier one in full

    def run(device: str) -> list[Any]:
        qd, kd, vd, gd = (t.to(device) for t in (q, k, v, grad))
        out, lse = attend(qd, kd[:, :, 1024:], vd[:, :, 1024:], True, None)
        out, lse = merge(out, lse, *attend(qd, kd[:, :, :1024], vd[:, :, :1024], False, None))
        results = [out]
        for (s, e), causal in spans:
            results += attend_backward(gd, qd, kd[:, :, s:e], vd[:, :, s:e], out, lse, causal, None)
        return results

    worst = max(_worst(g, w) for g, w in zip(run("cuda"), run("cpu"), strict=True))
    if worst > FP32_TOLERANCE:
        raise AssertionError(f"the ring's CUDA block primitives: {worst:.2e} > {FP32_TOLERANCE:.0e}")
    return {"worst_relative": worst}


def _context_rank(rank: int, world: int, port: int, model_dir: str, micro_json: str, out: str) -> None:
    import msgspec
    import torch
    import torch.distributed as dist

    from gyre.config import LossConfig
    from gyre.protocol import MicroStep
    from gyre.train import context
    from gyre.train.state import flat_gradient, load_model

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.cuda.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    try:
        micro = msgspec.json.decode(micro_json, type=MicroStep)
        model = load_model(model_dir).to(f"cuda:{rank}")
        stats = context.compute_gradients(model, micro, LossConfig(), 0, dist.group.WORLD)
        gradient = flat_gradient(model).double()
        figures = torch.tensor([stats.loss], dtype=torch.float64, device=gradient.device)
        dist.all_reduce(gradient)
        dist.all_reduce(figures)
        if rank == 0:
            torch.save(gradient.cpu(), f"{out}/gradient.pt")
            Path(out, "loss.json").write_text(json.dumps(float(figures[0])))
    finally:
        dist.destroy_process_group()


def _context_phase() -> dict[str, Any]:
    import msgspec
    import torch
    import torch.multiprocessing as mp

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from context_ranks import tree_micro_step
    from gyre.config import LossConfig
    from gyre.engine.launcher import free_port
    from gyre.engine.models import init_model
    from gyre.train.objective import compute_gradients
    from gyre.train.state import flat_gradient, load_model

    world = min(2, torch.cuda.device_count())
    micro = tree_micro_step(3, 2048, 8)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = init_model(Path(tmp) / "tiny", preset="tiny", seed=0)
        args = (world, free_port(), str(model_dir), msgspec.json.encode(micro).decode(), tmp)
        mp.start_processes(_context_rank, args=args, nprocs=world, start_method="spawn")
        got, loss = torch.load(Path(tmp, "gradient.pt")), json.loads(Path(tmp, "loss.json").read_text())
        model = load_model(model_dir)
        want_loss = compute_gradients(model, micro, LossConfig(), 0).loss
        want = flat_gradient(model).double()
    worst = _worst(got, want)
    if worst > FP32_TOLERANCE or abs(loss - want_loss) > FP32_TOLERANCE * abs(want_loss):
        raise AssertionError(f"CP={world} on CUDA: gradient {worst:.2e}, loss {loss} vs {want_loss}")
    return {"ranks": world, "worst_relative": worst, "loss": loss, "cpu_loss": want_loss}


def run() -> dict[str, Any]:
    """The three checks of the module, on the first GPU (the context check on up to two)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: this phase checks the CUDA branch")
    torch.backends.cuda.matmul.allow_tf32 = False
    return {"tree": _tree_phase(), "blocks": _blocks_phase(), "context": _context_phase()}


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))

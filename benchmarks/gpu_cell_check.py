"""A ``gpu_check`` phase (issue 57, item 7): the core cell of several ranks on its devices, end to end.

``gyre trainer core`` with ``trainer.ranks = N`` over ``--collective`` (nccl: each rank's replica and shard on its
GPU, the cell's group NCCL; gloo: the host, as the CPU tests run it), ``max_tokens_per_rank`` low enough that the
step's long micro-steps are computed by every rank together (context parallelism through `segment_attention`'s
device branch), and a satellite that joins while the step runs (its pair groups of the same collective, its learner
on its GPU). The update is compared with one process computing the same micro-steps on the CPU (fp32): AdamW's
first moment (0.1 x the gradient after one step) within ``--tolerance`` of its largest value, which a GPU's kernels
meet and a wrong reduction, a lost micro-step or a gradient counted twice do not.

    python benchmarks/gpu_cell_check.py --collective nccl --ranks 2 --json out.json

NCCL needs one GPU per rank: with fewer GPUs than ranks it says so and exits 3 (``gpu_check`` records a skip).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NOT_ENOUGH_GPUS = 3


def micro_steps(seed: int, sizes: list[int], vocab: int) -> list[Any]:
    """Chains of random tokens whose loss weights sum to 1 over the list."""
    from gyre.protocol import MicroStep

    rng = random.Random(seed)
    total = sum(n - 1 for n in sizes)
    out = []
    for n in sizes:
        ids = [rng.randrange(vocab) for _ in range(n)]
        out.append(MicroStep(input_ids=ids, position_ids=list(range(n)), parents=[-1, *range(n - 1)],
                             weights=[0.0] + [1.0 / total] * (n - 1), advantages=[rng.uniform(-1, 1)] * n,
                             behaviour_logprobs=[rng.uniform(-6.0, -4.0) for _ in range(n)], versions=[0] * n,
                             sequences=1))  # fmt: skip
    return out


def reference(model: Path, items: list[Any], lr: float) -> Any:
    """One process on the CPU computing the whole batch (fp32)."""
    import torch

    from gyre.config import TrainerConfig
    from gyre.train.objective import compute_gradients
    from gyre.train.state import TrainState

    torch.set_num_threads(1)
    state = TrainState(TrainerConfig(model_path=str(model), learning_rate=lr))
    for micro in items:
        compute_gradients(state.model, micro, state.cfg.loss, state.version, state.reference)
        state.add_model_gradients()
    state.apply()
    return state


def first_moments(saved: Path, names: list[str], sizes: list[int]) -> list[Any]:
    from gyre.train.checkpoint import load_flat_state

    flat = load_flat_state(saved / "optimizer", sum(sizes))
    out, at = [], 0
    for size in sizes:
        out.append(flat["exp_avg"][at : at + size])
        at += size
    return out


def run(collective: str, ranks: int, tolerance: float, work: Path) -> dict[str, Any]:
    import torch

    from gyre.engine.launcher import free_port
    from gyre.engine.models import init_model
    from gyre.train.trainerclient import TrainerClient, launch_core, launch_satellite

    if collective == "nccl" and torch.cuda.device_count() < ranks:
        print(f"a cell of {ranks} ranks over nccl needs {ranks} GPUs (one a rank); this machine has "
              f"{torch.cuda.device_count()}", flush=True)  # fmt: skip
        sys.exit(NOT_ENOUGH_GPUS)
    model = init_model(work / "tiny", preset="tiny")
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    lr, limit = 1e-3, 256
    items = micro_steps(57, [96, 700, 160, 1200, 64, 128, 900, 200], vocab)  # three longer than the limit
    address = f"tcp://127.0.0.1:{free_port()}"
    overrides = [
        f'trainer.model_path="{model}"',
        f"trainer.learning_rate={lr}",
        f"trainer.ranks={ranks}",
        f'trainer.collective="{collective}"',
        f"trainer.max_tokens_per_rank={limit}",
        "trainer.bucket_mib=4",
        "trainer.heartbeat_s=0.5",
        "trainer.member_timeout_s=60",
        "trainer.modelled_tokens_per_s=2000",
    ]  # fmt: skip (paced: the satellite gets some of the step)
    figures: dict[str, Any] = {"collective": collective, "ranks": ranks, "micro_steps": len(items),
                               "long_micro_steps": sum(len(m.input_ids) > limit for m in items)}  # fmt: skip
    core = launch_core(None, overrides, address, log=work / "core.log")
    satellite = None
    try:
        with TrainerClient(address, timeout_s=120) as client:
            started = time.monotonic()
            client.submit(0, items[:2])
            satellite = launch_satellite(address, "sat", 1, log=work / "sat.log")  # joins the step under way
            deadline = time.monotonic() + 180
            while client.statistics().members.get("sat") != "active":
                if time.monotonic() > deadline or satellite.poll() is not None:
                    raise RuntimeError(
                        f"the satellite did not join: {(work / 'sat.log').read_text()[-2000:]}"
                    )
                time.sleep(0.2)
            client.submit(0, items[2:], seal=True)
            metrics = client.wait_step(0, timeout_s=600)
            figures["step_s"] = time.monotonic() - started
            stats = client.statistics()
            deadline = time.monotonic() + 30  # the other ranks report after their update
            while any(r.get("reductions", 0) < 1 for r in stats.ranks) and time.monotonic() < deadline:
                time.sleep(0.2)
                stats = client.statistics()
            figures["by_member"] = dict(metrics.by_member)
            figures["context_micro_steps"] = stats.context_micro_steps
            figures["reduce_wire_bytes"] = [r.get("reduce_wire_bytes", 0) for r in stats.ranks]
            saved = client.save_checkpoint(work / "ckpt")
            client.shutdown()
    finally:
        for proc in (satellite, core):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    want = reference(model, items, lr)
    names = json.loads((saved / "trainer_state.json").read_text())["parameters"]
    params = dict(want.named)
    got = first_moments(saved, names, [params[n].numel() for n in names])
    scale = max(float(want.optimizer.state[params[n]]["exp_avg"].abs().max()) for n in names)
    moments = [want.optimizer.state[params[n]]["exp_avg"].reshape(-1) for n in names]
    worst = max(float((g - m).abs().max()) for g, m in zip(got, moments, strict=True))
    figures["moment_error"] = worst / scale
    figures["accounted"] = metrics.micro_steps == len(items) and sum(metrics.by_member.values()) == len(items)
    figures["ok"] = (
        figures["accounted"]
        and figures["moment_error"] <= tolerance
        and figures["context_micro_steps"] == figures["long_micro_steps"]
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--collective", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument(
        "--tolerance", type=float, default=1e-3, help="first-moment error, of its largest value"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        figures = run(args.collective, args.ranks, args.tolerance, Path(tmp))
    print(json.dumps(figures, indent=2), flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    sys.exit(0 if figures["ok"] else 1)


if __name__ == "__main__":
    main()

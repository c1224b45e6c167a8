"""Sharded checkpoints: optimizer state saved by N ranks loads on M (real processes over gloo), bit for bit; the
streamed, sharded Hugging Face export loads in transformers and the embedded engine; earlier checkpoints still load."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from checkpoint_ranks import adamw, run_rank
from gyre.config import EngineConfig, TrainerConfig
from gyre.engine.embedded.asyncengine import EmbeddedEngine
from gyre.protocol import GenerateRequest, SamplingParams
from gyre.train.checkpoint import flat_range, load_flat_state
from gyre.train.state import TrainState
from reference import hf_greedy, random_micro_steps, train_step

ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ranks(world: int, mode: str, reference: Path, checkpoint: Path, out: Path) -> None:
    """``world`` rank processes of ``checkpoint_ranks.run_rank``, to the end (an error in any fails the test)."""
    out.mkdir(exist_ok=True)
    args = (world, free_port(), mode, str(reference), str(checkpoint), str(out))
    mp.start_processes(run_rank, args=args, nprocs=world, start_method="forkserver")


def reference_run(path: Path) -> dict[str, torch.Tensor]:
    """A small model's AdamW state after 3 updates as one process holds it (written to ``path`` in the flat
    layout, with the next update's gradient), and that next update's result."""
    torch.manual_seed(0)  # 79401 values: 4 and 2 ranks both get uneven ranges
    model = torch.nn.Sequential(
        torch.nn.Linear(301, 199), torch.nn.Tanh(), torch.nn.Linear(199, 97, bias=False)
    )
    params = list(model.parameters())
    optimizer = adamw(params)
    for _ in range(4):
        for p in params:
            p.grad = torch.randn_like(p)
        if optimizer.state:
            break  # the 4th gradient is the next update's
        for _ in range(3):
            optimizer.step()
            for p in params:
                p.grad = torch.randn_like(p)

    def flat(values: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([v.detach().reshape(-1) for v in values])

    state = [optimizer.state[p] for p in params]
    saved = {"master": flat(params), "exp_avg": flat([s["exp_avg"] for s in state]),
             "exp_avg_sq": flat([s["exp_avg_sq"] for s in state]), "step": state[0]["step"].clone(),
             "next_grad": flat([p.grad for p in params])}  # fmt: skip
    saved |= {f"param.{name}": p.detach().clone() for name, p in model.named_parameters()}
    save_file(saved, str(path), metadata={"parameters": json.dumps([n for n, _ in model.named_parameters()])})
    optimizer.step()
    return saved | {"next.master": flat(params), "next.exp_avg": flat([s["exp_avg"] for s in state]),
                    "next.exp_avg_sq": flat([s["exp_avg_sq"] for s in state])}  # fmt: skip


@pytest.mark.slow(reason="six rank processes over gloo, each importing torch.distributed.checkpoint (~60 s)")
def test_optimizer_state_saved_by_four_ranks_loads_on_two_and_on_one_bit_for_bit(tmp_path: Path) -> None:
    ref = reference_run(tmp_path / "reference.safetensors")
    numel = ref["master"].numel()
    (tmp_path / "tokenizer.json").write_text("{}")  # travels with the weights
    ranks(4, "save", tmp_path / "reference.safetensors", tmp_path / "ckpt", tmp_path / "unused")
    ckpt = tmp_path / "ckpt"
    assert json.loads((ckpt / "trainer_state.json").read_text())["step"] == 3
    assert (ckpt / "config.json").is_file() and (ckpt / "tokenizer.json").read_text() == "{}"
    # the weights, gathered tensor by tensor from the shards, in files of at most 128 KiB
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {"0.weight": "model-00001-of-00002.safetensors",  # 240 KB: alone
                                   "0.bias": "model-00002-of-00002.safetensors",  # 796 B + 77 KB
                                   "2.weight": "model-00002-of-00002.safetensors"}  # fmt: skip
    exported: dict[str, torch.Tensor] = {}
    for file in set(index["weight_map"].values()):
        exported |= load_file(str(ckpt / file))
    params = {k.removeprefix("param."): v for k, v in ref.items() if k.startswith("param.")}
    assert exported.keys() == params.keys() and all(torch.equal(exported[k], v) for k, v in params.items())
    # the optimizer state: one file per rank, each about 1/4 of the state's bytes (three fp32 buffers)
    sizes = [(ckpt / "optimizer" / f"__{r}_0.distcp").stat().st_size for r in range(4)]
    assert (ckpt / "optimizer" / ".metadata").is_file()
    assert all(0.95 <= size / (3 * 4 * numel / 4) <= 1.05 for size in sizes), sizes

    ranks(2, "load", tmp_path / "reference.safetensors", ckpt / "optimizer", tmp_path / "out")
    for rank in range(2):
        start, stop = flat_range(numel, rank, 2)
        got = load_file(str(tmp_path / "out" / f"rank-{rank}.safetensors"))
        for key in ("master", "exp_avg", "exp_avg_sq"):
            assert torch.equal(got[f"loaded.{key}"], ref[key][start:stop]), (rank, key)
            # and the next update from the resharded state is the uninterrupted run's
            assert torch.equal(got[f"stepped.{key}"], ref[f"next.{key}"][start:stop]), (rank, key)
        assert (
            torch.equal(got["loaded.step"], ref["step"])
            and float(got["stepped.step"]) == float(ref["step"]) + 1
        )

    whole = load_flat_state(ckpt / "optimizer", numel)  # one process, no group: the whole buffers
    assert all(torch.equal(whole[k], ref[k]) for k in ("master", "exp_avg", "exp_avg_sq", "step"))


def save_trained(model: Path, directory: Path) -> TrainState:
    """Today's core (``TrainState``) after two updates, saved with its weights spread over 4 files."""
    state = TrainState(TrainerConfig(model_path=str(model), learning_rate=1e-3))
    for seed in range(2):
        train_step(state, random_micro_steps(seed, 2))
    state.save(directory, max_shard_bytes=2 * 2**20)  # 6.7 MB of fp32
    return state


def test_a_one_process_checkpoint_streams_sharded_weights_that_transformers_and_the_engine_load(
    tiny_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    state = save_trained(tiny_model, tmp_path / "ckpt")
    path = tmp_path / "ckpt"
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 4 and not (path / "model.safetensors").exists()

    hf = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32).eval()
    for (name, p), (_, q) in zip(state.named, hf.named_parameters(), strict=True):
        assert torch.equal(p, q), name

    async def generate() -> list[int]:
        engine = EmbeddedEngine(EngineConfig(model_path=str(path), num_threads=1))
        try:
            params = SamplingParams(max_new_tokens=6, temperature=0.0)
            out = await engine.generate(GenerateRequest(input_ids=[5, 6, 7], sampling_params=params))
            return out.output_ids
        finally:
            engine.close()

    assert asyncio.run(generate()) == hf_greedy(hf, [5, 6, 7], 6)


@pytest.mark.slow(reason="two rank processes over gloo after two training steps (~20 s)")
def test_a_one_process_checkpoint_loads_on_two_ranks(tiny_model: Path, tmp_path: Path) -> None:
    state = save_trained(tiny_model, tmp_path / "ckpt")
    flat = state.flat_state()
    save_file(flat | {"next_grad": torch.zeros_like(flat["master"])}, str(tmp_path / "reference.safetensors"))
    ranks(2, "load", tmp_path / "reference.safetensors", tmp_path / "ckpt" / "optimizer", tmp_path / "out")
    for rank in range(2):
        start, stop = flat_range(state.numel, rank, 2)
        got = load_file(str(tmp_path / "out" / f"rank-{rank}.safetensors"))
        for key in ("master", "exp_avg", "exp_avg_sq"):
            assert torch.equal(got[f"loaded.{key}"], flat[key][start:stop]), (rank, key)
        assert torch.equal(got["loaded.step"], flat["step"])


def test_a_checkpoint_of_the_earlier_single_file_format_still_resumes_bit_for_bit(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Checkpoints written before sharding (``model.safetensors`` + ``optimizer.safetensors``) keep resuming."""
    cfg = TrainerConfig(model_path=str(tiny_model), learning_rate=1e-3, lr_warmup_steps=2, weight_decay=0.01)
    steps = [random_micro_steps(seed, 2) for seed in range(3)]
    straight = TrainState(cfg)
    for items in steps:
        train_step(straight, items)
    first = TrainState(cfg)
    for items in steps[:2]:
        train_step(first, items)
    old = tmp_path / "old"  # the earlier TrainState.save, file for file
    old.mkdir()
    first.model.config.save_pretrained(old)
    for item in tiny_model.iterdir():
        if item.is_file() and item.suffix != ".safetensors" and item.name != "config.json":
            (old / item.name).write_bytes(item.read_bytes())
    weights = {n: t.detach().clone() for n, t in first.model.state_dict().items() if n != "lm_head.weight"}
    save_file(weights, str(old / "model.safetensors"), metadata={"format": "pt"})
    moments = {
        f"{i}.{k}": v for i, (_, p) in enumerate(first.named) for k, v in first.optimizer.state[p].items()
    }
    save_file(moments, str(old / "optimizer.safetensors"))
    (old / "trainer_state.json").write_text(json.dumps({"step": 2, "version": 2, "data_cursor": {},
                                                        "parameters": [n for n, _ in first.named]}))  # fmt: skip
    resumed = TrainState(msgspec_replace(cfg, resume_from=str(old)))
    assert (resumed.step, resumed.version) == (2, 2)
    train_step(resumed, steps[2])
    assert torch.equal(resumed.flat, straight.flat)


def msgspec_replace(cfg: TrainerConfig, **changes: object) -> TrainerConfig:
    import msgspec

    return msgspec.structs.replace(cfg, **changes)


def test_the_streamed_export_holds_about_one_tensor_not_the_model(tmp_path: Path) -> None:
    """128 MiB of weights made one 8 MiB tensor at a time: the export's peak extra resident memory stays near one
    tensor; the whole-dict save it replaced needs the model. (glibc's malloc keeps freed 8 MiB blocks for reuse
    unless its mmap threshold is fixed, which would measure the allocator, not the export.)"""
    env = os.environ | {"MALLOC_MMAP_THRESHOLD_": "131072"}
    out = tmp_path / "figures.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "checkpoint_export.py"), "--model-mib", "128",
               "--tensor-mib", "8", "--shard-mib", "32", "--json", str(out)]  # fmt: skip
    subprocess.run(command, check=True, env=env, capture_output=True, timeout=120)
    results = json.loads(out.read_text())["results"]
    assert results["streamed"]["files"] == 4 and results["streamed"]["bytes_mib"] > 128
    assert results["streamed"]["peak_extra_mib"] < 2 * 8 + 4
    assert results["whole"]["peak_extra_mib"] > 120

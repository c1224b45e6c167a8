"""The one prepared check Gyre runs on a lent GPU machine: a real SGLang server behind Gyre, end to end, with figures.

    python benchmarks/gpu_check.py [--out DIR] [--skip-install] [--engine sglang|embedded] [--trainer megatron|torch]

Phases, each timed and under a time limit. A failing one prints its error and the next one runs (the exit status
is then 1); one that cannot run here is skipped, saying why.
  install     ``pip install -e .``, ``megatron-core`` and ``-e .[gpu]`` (from ``.whl/`` alone where that folder
              exists: no package registry), then the script runs again, with ``--skip-install``, on this tree's src/
  serve       a model made here (``init_model``: nothing downloaded), ``launch_sglang`` and ``gyre router``
  tokens      multi-turn chats through the router: each record is what the agent got, token for token, each turn
              extends the one before, and teacher forcing the recorded tokens as the trainer does
              (``token_logprobs`` over ``build_step``'s micro-steps) reproduces the recorded logprobs
  throughput  decode tokens/s through the router vs straight to the engine: same prompts, concurrent requests
  push        ``push_weights`` with a version, per tensor and as one bucket: the engine serves that version and
              those weights; bytes / seconds
  memory      release and resume the engine's memory, then a push and a generation
  train       one step of a core trainer (``backend="megatron"``) over the router's records; the engine, attached
              to the core, then serves the step's version
  sharded     the sharded core's state (``ShardedState``) on a 1-rank NCCL group against the one-process
              ``TrainState`` on the same micro-steps: updates equal within 1e-6, gradients reduce-scattered and
              weights all-gathered in buckets of CUDA tensors; the rank's bytes (``benchmarks/sharded_check.py``)
  attention   `segment_attention`'s CUDA branch (FlexAttention, a block mask from the segments, grouped K/V) and the
              ring's block primitives against the CPU path, and a context-parallel micro-step on min(2, GPUs) NCCL
              ranks against one CPU process (``benchmarks/gpu_attention_check.py``)
  cell        the core cell of 2 ranks over NCCL (each rank's replica and shard on its GPU), a satellite joining the
              step, long micro-steps computed by both ranks together: the update against one CPU process
              (``benchmarks/gpu_cell_check.py``; skipped with fewer than 2 GPUs: NCCL takes one a rank)
  xlong       the tiny model's training step on one chain of 700,000 tokens (``--xlong-tokens``) on one GPU (CP=1):
              seconds and ``torch.cuda.max_memory_allocated``, beside `gyre.train.budget`'s projection (printed
              first); issue 47's check of what the CPU only fits and projects (``benchmarks/xlong.py --parts c``)

Writes DIR/gpu_check.json (default benchmarks/results) and the servers' logs beside it. ``--engine embedded`` runs
the phases on Gyre's embedded engine instead, so that the script runs without a GPU too (gloo instead of nccl).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
INSTALL_RESULT = "GYRE_GPU_CHECK_INSTALL"  # the install phase's outcome (JSON), handed to the run after it


@dataclass
class Phase:
    """One phase's outcome: ``status`` ok, failed or skipped; its figures are kept even when it failed."""

    name: str
    status: str = "ok"
    seconds: float = 0.0
    detail: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


def install() -> None:
    """Install the GPU path's packages, then run this script again with them (never returns)."""
    print("== install", flush=True)
    phase, started, python, failures = Phase("install"), time.monotonic(), sys.executable, []
    try:
        if sys.prefix == sys.base_prefix:  # a system Python may refuse pip: a venv that still sees its torch
            venv = Path(tempfile.gettempdir()) / "gyre-gpu-venv"
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
            python = str(venv / "bin" / "python")
        pip = [python, "-m", "pip", "install", "-q", "--retries", "0", "--timeout", "15"]
        if (ROOT / ".whl").is_dir():  # offline: the wheels carried along (setuptools too, to build gyre)
            pip += ["--no-index", "--find-links", str(ROOT / ".whl")]
        # pyproject's gpu extra is sglang[all] (which pins its own torch); each apart, so one failing stops none
        for packages in (["-e", "."], ["megatron-core"], ["-e", ".[gpu]"]):
            if subprocess.run([*pip, *packages], cwd=ROOT, timeout=300).returncode:
                failures.append(f"pip install {' '.join(packages)} failed")
    except (OSError, subprocess.SubprocessError) as exc:
        failures.append(str(exc))
    phase.seconds = time.monotonic() - started
    if failures:
        phase.status = "failed"
        phase.detail = "; ".join(failures) + " (no package registry? wheels go in .whl/)"
    print(f"   {phase.status} in {phase.seconds:.1f} s {phase.detail}", flush=True)
    # this tree's gyre, also where its editable install failed (child processes inherit it)
    path = os.pathsep.join(x for x in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if x)
    env = {**os.environ, INSTALL_RESULT: json.dumps(asdict(phase)), "PYTHONPATH": path}
    os.execve(python, [python, __file__, *sys.argv[1:], "--skip-install"], env)


def parse_args() -> argparse.Namespace:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="results folder")
    parser.add_argument("--skip-install", action="store_true", help="use this Python's packages as they are")
    parser.add_argument("--engine", choices=["sglang", "embedded"], default="sglang")
    parser.add_argument("--trainer", choices=["megatron", "torch"], default="megatron")
    parser.add_argument("--preset", choices=["tiny", "small"], help="default: small (embedded: tiny)")
    parser.add_argument("--xlong-tokens", type=int, default=700_000, help="the xlong phase's chain (tokens)")
    return parser.parse_args()


if __name__ == "__main__" and not parse_args().skip_install:
    install()

try:  # after the install phase: what it installs
    import httpx
    import msgspec
    import torch
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from gyre.config import TrainerConfig
    from gyre.engine import weight_sync
    from gyre.engine.engineclient import EngineClient
    from gyre.engine.launcher import free_port, launch_embedded, launch_sglang
    from gyre.engine.models import count_parameters, init_model
    from gyre.journal.records import CallRecord, expand_inputs
    from gyre.protocol import MicroStep, SamplingParams
    from gyre.router.spawn import launch_router
    from gyre.train.loss import every_token, token_logprobs
    from gyre.train.step import Rollout, build_step
    from gyre.train.trainerclient import TrainerClient, launch_core
except ImportError as exc:  # nothing below can run; the install phase's error (if it ran) is above
    sys.exit(f"gpu_check: {exc}; install gyre's dependencies (pip install -e .) or drop --skip-install")

GROUP = "gpu-check"  # the weight-transfer group this script opens with the engine
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
PUSHED = {"tensors": 100, "bucket": 101, "resumed": 102}  # each push's weight version (the model's: 0)


class Skip(Exception):
    """A phase that cannot run here; the message says why."""


@dataclass
class Context:
    """What the phases hand on to each other."""

    args: argparse.Namespace
    work: Path  # the models and the router's journal (temporary)
    stack: contextlib.ExitStack  # stops every server and trainer started
    cuda: bool = False
    collective: str = "gloo"  # torch.distributed backend of weight transfers: nccl with CUDA
    model: Path | None = None
    model_b: Path | None = None  # the weights pushed
    engine: Any = None  # gyre.engine.launcher.ServerProcess
    admin: str = ""  # the router's admin URL
    atol: float = 1e-3  # |engine logprob - teacher-forced fp32 logprob| allowed; bf16 engines on GPU: 0.1
    rollouts: list[Rollout] = field(default_factory=list)  # the tokens phase's conversations
    group: weight_sync.WeightGroup | None = None  # opened with the engine by the push phase
    weights: list[tuple[str, torch.Tensor]] = field(default_factory=list)  # model_b's tensors, as pushed
    models: dict[Path, Any] = field(default_factory=dict)  # Hugging Face models for teacher forcing


def require(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)


async def all_of(coroutines: Iterable[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Run concurrently in one task group; their results in order."""
    async with asyncio.TaskGroup() as tasks:
        started = [tasks.create_task(c) for c in coroutines]
    return [t.result() for t in started]


def teacher_forced(ctx: Context, path: Path, micro: MicroStep) -> list[float]:
    """``token_logprobs`` of ``micro`` under the weights in ``path`` (fp32 Hugging Face model, loaded once)."""
    if path not in ctx.models:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
        ctx.models[path] = model.to("cuda" if ctx.cuda else "cpu").eval()
    with torch.no_grad():
        return token_logprobs(ctx.models[path], micro, scored=every_token(micro)).tolist()


async def check_serves(ctx: Context, client: EngineClient, version: int, path: Path) -> float:
    """The engine reports ``version`` and samples from the weights in ``path``; the largest logprob difference."""
    out = await client.generate(PROMPT, SamplingParams(max_new_tokens=16, ignore_eos=True, sampling_seed=0))
    served = await client.get_weight_version()
    require(out.meta_info.weight_version == str(version) and served == version,
            f"pushed version {version}; the engine serves {served} ({out.meta_info.weight_version!r})")  # fmt: skip
    ids, n = PROMPT + out.output_ids, len(PROMPT)
    zeros = [0.0] * len(ids)
    chain = MicroStep(input_ids=ids, position_ids=list(range(len(ids))), parents=list(range(-1, len(ids) - 1)),
                      weights=zeros, advantages=zeros, behaviour_logprobs=zeros, versions=[0] * len(ids),
                      sequences=1)  # fmt: skip
    ref = (await asyncio.to_thread(teacher_forced, ctx, path, chain))[n:]
    diff = max(abs(a - b) for a, b in zip(out.output_logprobs, ref, strict=True))
    require(diff <= ctx.atol, f"logprobs differ from the pushed weights' by up to {diff:.4f} (> {ctx.atol})")
    return diff


async def open_session(http: httpx.AsyncClient, admin: str, execution_id: str) -> str:
    """A new router session's OpenAI base URL."""
    resp = await http.post(admin + "/admin/sessions", json={"execution_id": execution_id})
    return str(resp.raise_for_status().json()["base_url"])


async def chat(http: httpx.AsyncClient, base: str, messages: list[Any], max_tokens: int, seed: int) -> Any:
    body = {"model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 1.0,
            "seed": seed, "logprobs": True, "return_token_ids": True}  # fmt: skip
    return (await http.post(base + "/chat/completions", json=body)).raise_for_status().json()


# ---- phases ------------------------------------------------------------------------------------------------------
def serve(ctx: Context, figures: dict[str, Any]) -> None:
    import importlib.metadata

    ctx.cuda = torch.cuda.is_available()
    figures["device"] = torch.cuda.get_device_name() if ctx.cuda else "cpu"
    for package in ("torch", "sglang", "megatron-core"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            figures[package] = importlib.metadata.version(package)
    if ctx.args.engine == "sglang" and not ctx.cuda:
        raise Skip("SGLang needs a CUDA device; --engine embedded runs the other phases without one")
    ctx.collective, ctx.atol = ("nccl", 0.1) if ctx.cuda else ("gloo", 1e-3)
    preset = ctx.args.preset or ("small" if ctx.args.engine == "sglang" else "tiny")  # small: head_dim 64
    ctx.model = init_model(ctx.work / "model", preset=preset, seed=0)
    ctx.model_b = init_model(ctx.work / "model-b", preset=preset, seed=1)
    figures["parameters"] = count_parameters(ctx.model)
    started, log = time.monotonic(), ctx.args.out / "gpu_check-engine.log"
    if ctx.args.engine == "sglang":
        ctx.engine = launch_sglang(ctx.model, mem_fraction_static=0.3, log_path=log, timeout_s=280)
    else:
        ctx.engine = launch_embedded(ctx.model, overrides=["engine.kv_cache_mem_gib=0.25"], log_path=log)
    ctx.stack.callback(ctx.engine.stop)
    figures["engine_start_s"], started = time.monotonic() - started, time.monotonic()
    router, ctx.admin = launch_router(ctx.model, [ctx.engine.url], journal_dir=ctx.work / "journal",
                                      log_path=ctx.args.out / "gpu_check-router.log")  # fmt: skip
    ctx.stack.callback(router.stop)
    figures["router_start_s"] = time.monotonic() - started


def tokens(ctx: Context, figures: dict[str, Any]) -> None:
    if not ctx.admin or ctx.model is None:
        raise Skip("no router: serve did not finish")
    conversations, turns = 4, 3

    async def converse(http: httpx.AsyncClient, i: int) -> tuple[list[Any], list[CallRecord]]:
        base, bodies = await open_session(http, ctx.admin, f"x{i}"), []
        messages: list[Any] = [{"role": "user", "content": f"conversation {i}: tell me a story"}]
        for turn in range(turns):
            bodies.append(await chat(http, base, messages, max_tokens=24, seed=turns * i + turn))
            reply = {k: v for k, v in bodies[-1]["choices"][0]["message"].items() if v is not None}
            messages += [reply, {"role": "user", "content": "go on"}]
        raw = (await http.get(base + "/gyre/records")).content
        return bodies, msgspec.json.decode(raw, type=dict[str, list[CallRecord]])["records"]

    async def go() -> list[tuple[list[Any], list[CallRecord]]]:
        async with httpx.AsyncClient(timeout=60) as http:
            return await all_of(converse(http, i) for i in range(conversations))

    results = asyncio.run(go())
    ctx.rollouts = [Rollout(execution_id=f"x{i}", group="g0", reward=float(i % 2), records=records)
                    for i, (_, records) in enumerate(results)]  # fmt: skip
    inexact, unextended = [], 0
    for bodies, records in results:
        require(len(records) == len(bodies), f"{len(bodies)} calls made, {len(records)} recorded")
        full = expand_inputs(records)
        for n, (body, record) in enumerate(zip(bodies, records, strict=True)):
            choice = body["choices"][0]
            sent = [e["logprob"] for e in choice["logprobs"]["content"]]
            got = (choice["token_ids"], body["prompt_token_ids"], sent)
            if (record.output_ids, full[record.call_id], record.output_logprobs) != got:
                inexact.append(record.call_id)
            unextended += n > 0 and record.parent_call_id != records[n - 1].call_id
    figures.update(calls=sum(len(r.records) for r in ctx.rollouts), inexact_records=len(inexact),
                   unextended_turns=unextended)  # fmt: skip
    require(not inexact, f"records that are not what the agent got: {inexact}")
    require(not unextended, f"{unextended} later turns do not extend the call before them")
    diffs: list[float] = []
    for micro in build_step(ctx.rollouts).micro_steps:  # what the trainer would compute, token for token
        forced, recorded = teacher_forced(ctx, ctx.model, micro), micro.behaviour_logprobs
        diffs += [abs(forced[i] - recorded[i]) for i, v in enumerate(micro.versions) if v >= 0]  # sampled
    mean = sum(diffs) / len(diffs)
    figures.update(sampled_tokens=len(diffs), logprob_max_abs=max(diffs), logprob_mean_abs=mean)
    require(max(diffs) <= ctx.atol, f"teacher forcing differs by up to {max(diffs):.4f} (> {ctx.atol})")


def throughput(ctx: Context, figures: dict[str, Any]) -> None:
    if not ctx.admin:
        raise Skip("no router: serve did not finish")
    n, max_tokens, rounds = (128, 256, 2) if ctx.args.engine == "sglang" else (8, 32, 2)
    figures.update(requests=n, max_tokens=max_tokens)
    prompts = [[{"role": "user", "content": f"request {i}: write a long story"}] for i in range(n)]

    async def go() -> None:
        http = httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=None))
        async with http, EngineClient(ctx.engine.url) as engine:

            async def routed(tag: str, max_new: int) -> list[Any]:
                bases = await all_of(open_session(http, ctx.admin, f"{tag}-{i}") for i in range(n))
                return await all_of(chat(http, bases[i], prompts[i], max_new, i) for i in range(n))

            ids = [body["prompt_token_ids"] for body in await routed("warm", 1)]  # the router's rendering
            sampling = [SamplingParams(max_new_tokens=max_tokens, sampling_seed=i) for i in range(n)]

            async def direct(r: int) -> int:
                outs = await all_of(engine.generate(ids[i], sampling[i]) for i in range(n))
                return sum(len(o.output_ids) for o in outs)

            async def router(r: int) -> int:
                return sum(b["usage"]["completion_tokens"] for b in await routed(f"r{r}", max_tokens))

            for r in range(rounds):  # alternating; each way's best round counts
                for way, run in (("direct", direct), ("router", router)):
                    await engine.flush_cache()  # neither way starts from the other's prefix cache
                    started = time.perf_counter()
                    generated = await run(r)
                    rate = generated / (time.perf_counter() - started)
                    figures[f"{way}_tok_s"] = max(rate, figures.get(f"{way}_tok_s", 0.0))

    asyncio.run(go())
    figures["router_vs_direct"] = figures["router_tok_s"] / figures["direct_tok_s"]


def push(ctx: Context, figures: dict[str, Any]) -> None:
    if ctx.engine is None or ctx.model_b is None:
        raise Skip("no engine: serve did not finish")
    path = ctx.model_b
    tensors = load_file(str(path / "model.safetensors"), device="cuda" if ctx.cuda else "cpu")
    ctx.weights = sorted(tensors.items())
    size = sum(t.numel() * t.element_size() for _, t in ctx.weights)
    figures.update(weight_mib=size / 2**20, tensors=len(ctx.weights), collective=ctx.collective)

    async def go() -> None:
        async with EngineClient(ctx.engine.url) as client:
            port = free_port()
            ctx.group, _ = await all_of([
                asyncio.to_thread(weight_sync.create_group, "127.0.0.1", port, 0, 2, GROUP, ctx.collective),
                client.init_weights_update_group("127.0.0.1", port, 1, 2, GROUP, ctx.collective),
            ])  # fmt: skip
            for label in ("tensors", "bucket"):
                started = time.perf_counter()
                await weight_sync.push_weights(client, ctx.group, ctx.weights, PUSHED[label], GROUP,
                                               flattened=label == "bucket")  # fmt: skip
                seconds = time.perf_counter() - started
                figures.update({f"{label}_s": seconds, f"{label}_gb_s": size / seconds / 1e9})
                figures[f"{label}_logprob_max_abs"] = await check_serves(ctx, client, PUSHED[label], path)

    asyncio.run(go())


def memory(ctx: Context, figures: dict[str, Any]) -> None:
    if ctx.engine is None:
        raise Skip("no engine: serve did not finish")

    async def go() -> None:
        async with EngineClient(ctx.engine.url) as client:
            free = torch.cuda.mem_get_info()[0] if ctx.cuda else 0
            started = time.perf_counter()
            await client.release_memory_occupation()
            figures["release_s"] = time.perf_counter() - started
            if ctx.cuda:
                figures["released_gib"] = (torch.cuda.mem_get_info()[0] - free) / 2**30
            started = time.perf_counter()
            await client.resume_memory_occupation()
            figures["resume_s"] = time.perf_counter() - started
            if ctx.group is not None and ctx.model_b is not None:  # SGLang resumes weights it no longer has
                await weight_sync.push_weights(client, ctx.group, ctx.weights, PUSHED["resumed"], GROUP)
                figures["logprob_max_abs"] = await check_serves(ctx, client, PUSHED["resumed"], ctx.model_b)
            else:
                out = await client.generate(PROMPT, SamplingParams(max_new_tokens=16, ignore_eos=True))
                require(len(out.output_ids) == 16, f"{len(out.output_ids)} of 16 tokens after resuming")

    asyncio.run(go())


def train(ctx: Context, figures: dict[str, Any]) -> None:
    if not ctx.rollouts or ctx.engine is None:
        raise Skip("no records to train on: tokens did not finish")
    fields: dict[str, Any] = {"model_path": str(ctx.model), "learning_rate": 1e-4, "transfer_timeout_s": 120.0,
                              "backend": ctx.args.trainer, "collective": ctx.collective}  # fmt: skip
    if ctx.args.trainer == "megatron":
        fields["tensor_parallel"] = 1
    try:  # the check `gyre trainer core` makes, made here to skip cleanly
        msgspec.convert(fields, TrainerConfig)
    except (msgspec.ValidationError, TypeError) as exc:
        raise Skip(f"TrainerConfig lacks backend/collective/tensor_parallel: {exc}") from None
    address = f"tcp://127.0.0.1:{free_port()}"
    overrides = [f"trainer.{key}={json.dumps(value)}" for key, value in fields.items()]
    core = launch_core(None, overrides, address, log=ctx.args.out / "gpu_check-core.log", timeout_s=180)
    ctx.stack.callback(lambda: core.poll() is None and core.kill())
    with TrainerClient(address, timeout_s=120) as client:
        started = time.monotonic()
        client.submit(0, build_step(ctx.rollouts).micro_steps, seal=True)
        metrics = client.wait_step(0, timeout_s=180)
        figures["step_s"] = time.monotonic() - started
        print(f"   StepDone: {msgspec.json.encode(metrics).decode()}", flush=True)
        keep = ("version", "loss", "tokens", "micro_steps", "ratio_mean", "ratio_max", "grad_norm", "entropy")
        figures.update({key: getattr(metrics, key) for key in keep})
        require(metrics.tokens > 0 and metrics.version == 1, f"{metrics} is not one step of tokens")
        started = time.monotonic()
        figures["attach"] = client.attach_engine(ctx.engine.url, timeout_s=120)  # pushes the new weights
        figures["attach_s"] = time.monotonic() - started

        async def served() -> int:
            async with EngineClient(ctx.engine.url) as engine:
                return await engine.get_weight_version()

        version = asyncio.run(served())
        require(version == metrics.version, f"the engine serves version {version}, not {metrics.version}")
        client.shutdown()


def sharded(ctx: Context, figures: dict[str, Any]) -> None:
    cuda = torch.cuda.is_available()
    if not cuda and ctx.args.engine == "sglang":
        raise Skip("NCCL needs a CUDA device; --engine embedded runs this check over gloo on the CPU")
    out = ctx.work / "sharded.json"
    # its own process: a process group of its own, and nothing of it left in this one (the push phase's group)
    command = [sys.executable, str(ROOT / "benchmarks" / "sharded_check.py"), "--device", "cuda" if cuda else "cpu",
               "--json", str(out)]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=220)
    print("   " + (proc.stdout + proc.stderr).strip()[-2000:].replace("\n", "\n   "), flush=True)
    if out.exists():
        found = json.loads(out.read_text())
        stats = found.pop("statistics")
        figures.update(found)
        figures.update({k: v for k, v in stats.items() if k.endswith("_bytes")})
    require(proc.returncode == 0, f"sharded_check exited {proc.returncode}")


def attention(ctx: Context, figures: dict[str, Any]) -> None:
    if not torch.cuda.is_available():
        raise Skip("segment_attention's CUDA branch needs a CUDA device (its numerics are pinned on the CPU by "
                   "tests/unit/train/test_attention.py where torch runs FlexAttention there)")  # fmt: skip
    import gpu_attention_check  # benchmarks/, beside this script

    figures.update(gpu_attention_check.run())


def cell(ctx: Context, figures: dict[str, Any]) -> None:
    import gpu_cell_check  # benchmarks/, beside this script

    cuda = torch.cuda.is_available()
    if not cuda and ctx.args.engine == "sglang":
        raise Skip("NCCL needs CUDA devices; --engine embedded runs this check over gloo on the CPU")
    out = ctx.work / "cell.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_cell_check.py"), "--collective",
               "nccl" if cuda else "gloo", "--ranks", "2", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=500)
    print("   " + (proc.stdout + proc.stderr).strip()[-2000:].replace("\n", "\n   "), flush=True)
    if proc.returncode == gpu_cell_check.NOT_ENOUGH_GPUS:
        raise Skip(f"a cell of 2 ranks over NCCL needs 2 GPUs; this machine has {torch.cuda.device_count()}")
    if out.exists():
        figures.update(json.loads(out.read_text()))
    require(proc.returncode == 0, f"gpu_cell_check exited {proc.returncode}")


def xlong(ctx: Context, figures: dict[str, Any]) -> None:
    if not torch.cuda.is_available():
        raise Skip("the tiny model's 700K-token step needs a CUDA device (the CPU fits and projects it: "
                   "benchmarks/xlong.py --parts c)")  # fmt: skip
    from gyre.config import LossConfig
    from gyre.train.budget import FP32_LOCAL, step_budget
    from gyre.train.objective import compute_gradients
    from gyre.train.state import load_model
    from xlong_ranks import chain_micro_step  # benchmarks/, beside this script

    tokens, gib = ctx.args.xlong_tokens, 2**30
    directory = init_model(ctx.work / "xlong-tiny", preset="tiny")
    config = json.loads((directory / "config.json").read_text())
    micro = chain_micro_step(tokens, config["vocab_size"])  # calls of 600 in + 100 sampled (scored) tokens
    scored = sum(1 for w in micro.weights if w > 0)
    budget = step_budget(config, tokens, precision=FP32_LOCAL, scored_tokens=scored)  # CP=1, no checkpointing
    figures |= {"tokens": tokens, "predicted_gib": budget.memory_bytes / gib, "tflop": budget.flops / 1e12}
    terms = ", ".join(f"{k} {v / gib:.2f}" for k, v in budget.memory.items() if v)
    print(f"   predicted (gyre.train.budget): {budget.memory_bytes / gib:.1f} GiB ({terms}); "
          f"{budget.flops / 1e12:,.0f} TFLOP, {100 * budget.attention_flops / budget.flops:.0f}% attention", flush=True)  # fmt: skip
    model = load_model(directory).to("cuda")
    try:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        started = time.monotonic()
        stats = compute_gradients(model, micro, LossConfig(), 0)
        torch.cuda.synchronize()
        figures["forward_backward_s"] = time.monotonic() - started
        torch.optim.AdamW(model.parameters(), lr=1e-5).step()
        torch.cuda.synchronize()
        figures["step_s"] = time.monotonic() - started
        figures["loss"] = stats.loss
    finally:
        figures["max_allocated_gib"] = torch.cuda.max_memory_allocated() / gib
        del model
        torch.cuda.empty_cache()
    figures["measured_over_predicted"] = figures["max_allocated_gib"] / figures["predicted_gib"]
    print(f"   {tokens:,} tokens: {figures['step_s']:.1f} s, max allocated {figures['max_allocated_gib']:.1f} GiB",
          flush=True)  # fmt: skip


PhaseFn = Callable[[Context, dict[str, Any]], None]  # fills in its figures as it goes
PHASES: list[tuple[str, PhaseFn, float]] = [  # name, phase, time limit (s)
    ("serve", serve, 300.0),
    ("tokens", tokens, 120.0),
    ("throughput", throughput, 150.0),
    ("push", push, 120.0),
    ("memory", memory, 120.0),
    ("train", train, 300.0),
    ("sharded", sharded, 240.0),
    ("attention", attention, 300.0),
    ("cell", cell, 540.0),
    ("xlong", xlong, 600.0),
]


def run_phase(ctx: Context, name: str, fn: PhaseFn, limit_s: float) -> Phase:
    """Run one phase in a daemon thread, so that one which outruns its limit is left behind, not waited for."""
    print(f"== {name}", flush=True)
    phase, errors = Phase(name), []

    def target() -> None:
        try:
            fn(ctx, phase.figures)
        except BaseException as exc:
            errors.append(exc)

    started = time.monotonic()
    worker = threading.Thread(target=target, name=f"phase-{name}", daemon=True)
    worker.start()
    worker.join(limit_s)
    phase.seconds = time.monotonic() - started
    if worker.is_alive():
        phase.status, phase.detail = "failed", f"timed out after {limit_s:g} s"
    elif errors and isinstance(errors[0], Skip):
        phase.status, phase.detail = "skipped", str(errors[0])
    elif errors:
        traceback.print_exception(errors[0])
        phase.status, phase.detail = "failed", f"{type(errors[0]).__name__}: {errors[0]}"
    print(f"   {phase.status} in {phase.seconds:.1f} s {phase.detail}", flush=True)
    return phase


def report(phases: list[Phase], args: argparse.Namespace) -> None:
    table = Table(title="Gyre GPU check")
    for column in ("phase", "status", "s", "figures"):
        table.add_column(column, overflow="fold")
    colour = {"ok": "green", "failed": "red", "skipped": "yellow"}
    for p in phases:
        shown = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in p.figures.items()]
        text = escape("\n".join(x for x in ("  ".join(shown), p.detail) if x))
        table.add_row(p.name, f"[{colour[p.status]}]{p.status}", f"{p.seconds:.1f}", text)
    Console(width=160).print(table)
    path, command = args.out / "gpu_check.json", " ".join([Path(sys.executable).name, *sys.argv])
    path.write_text(json.dumps({"command": command, "phases": [asdict(p) for p in phases]}, indent=2) + "\n")
    print(f"wrote {path}")


def main() -> int:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for log in args.out.glob("gpu_check-*.log"):  # servers append to their logs
        log.unlink()
    phases = [Phase(**json.loads(os.environ[INSTALL_RESULT]))] if INSTALL_RESULT in os.environ else []
    with tempfile.TemporaryDirectory(prefix="gyre-gpu-check-") as tmp, contextlib.ExitStack() as stack:
        ctx = Context(args=args, work=Path(tmp), stack=stack)
        phases += [run_phase(ctx, name, fn, limit_s) for name, fn, limit_s in PHASES]
    report(phases, args)
    return 1 if any(p.status == "failed" for p in phases) else 0


if __name__ == "__main__":
    sys.exit(main())

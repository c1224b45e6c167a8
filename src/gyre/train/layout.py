"""A training cell's layout from ``[trainer]``, checked against the model's shapes and the cell's machine before
anything starts.

The core cell runs ``tensor_parallel x pipeline_parallel x ranks`` rank processes: tensor/pipeline model parallel
(the Megatron backend) times ``ranks`` data-parallel ranks over which the fp32 master weights, the gradient sum and
AdamW's moments are split (the torch backend's sharded core, `gyre.train.sharded`). `check_layout` refuses, with a
`ConfigError` that says what does not fit and what would, a layout that:

- combines what is not built: several data-parallel ranks on the Megatron backend, tensor/pipeline parallel on the torch backend;
- the model's shapes do not split into (heads, key/value heads, layers; on Megatron also the MLP width and the
  vocabulary, as `gyre.train.megatron.convert` splits them);
- needs more GPUs than the cell has (nccl: one GPU per rank), or more than 8 rank processes per CPU core (gloo);
- on GPUs, cannot hold the sharded core's state: projected with `gyre.train.memory.device_memory`, at least what
  `SHARDED_TORCH` says a rank keeps (activations not counted, so only a layout that can never fit is refused).

`gyre train` (`gyre.driver.training.train`) and ``gyre trainer core`` call it first; no torch is imported unless the
collective is nccl or the backend Megatron.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gyre.config import TrainerConfig
from gyre.errors import ConfigError
from gyre.train.memory import GIB, CellLayout, DeviceMemory, ModelShape, Precision, device_memory

# what a rank of the sharded torch core keeps on its GPU (gyre.train.sharded, gyre.train.corecell): an fp32 replica
# and its .grad (as placed today; a bf16 replica beside the fp32 master, weight = gradient = activation = 2, is not
# built), the fp32 master weights and AdamW moments and the float64 gradient sum of its shard, and (``local_sum``, by
# trainer.gradient_accumulation) the sum of its own micro-steps' gradients over the whole replica
SHARDED_TORCH = Precision(
    "fp32 replica, fp32 master, float64 sum", weight=4, gradient=4, master=4, moment=4, gradient_sum=8, wire=8,
    activation=4, local_sum=8,
)  # fmt: skip
LOCAL_SUM_BYTES = {
    "float64": 8,
    "float32": 4,
    "rounds": 0,
}  # trainer.gradient_accumulation -> bytes a parameter
# gloo rank processes per CPU core past which a cell is refused (each computes on a whole replica)
RANKS_PER_CPU = 8
# said of a sharded torch cell over nccl until benchmarks/gpu_check.py's cell phases have passed on a lent device
NOT_YET_ON_GPUS = (
    "not yet run on GPUs: the sharded core over nccl (each rank's replica and shard on its GPU) is written on the "
    "code path the CPU tests run, and benchmarks/gpu_check.py's cell phases have not passed on a device yet"
)


def read_model_config(model_dir: str | Path) -> dict[str, Any] | None:
    """``model_dir/config.json`` as a dict; None when there is none (a missing model is refused where it loads)."""
    path = Path(model_dir) / "config.json"
    if not str(model_dir) or not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not a readable JSON file: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a JSON object")
    return config


def model_shape(model_config: Mapping[str, Any]) -> ModelShape:
    """The shapes of a ``config.json`` dict; a missing field is a ConfigError naming it."""
    try:
        return ModelShape.from_config(model_config)
    except KeyError as exc:
        raise ConfigError(
            f"the model's config.json has no {exc.args[0]!r}: its layout cannot be checked"
        ) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"the model's config.json has a field of the wrong type: {exc}") from None


def _layout_text(cfg: TrainerConfig) -> str:
    t, p, s = cfg.tensor_parallel, cfg.pipeline_parallel, cfg.ranks
    return f"tensor_parallel {t} x pipeline_parallel {p} x ranks {s} = {t * p * s} rank processes"


def _shape_error(
    cfg: TrainerConfig, model_config: Mapping[str, Any], tensor: int, pipeline: int
) -> str | None:
    """Why ``tensor`` x ``pipeline`` cannot split the model (None: it can), by memory's rules and Megatron's."""
    try:
        CellLayout(tensor=tensor, pipeline=pipeline).check(model_shape(model_config))
    except ValueError as exc:
        return str(exc)
    if cfg.backend == "megatron":
        from gyre.train.megatron.convert import Architecture

        architecture = Architecture.from_hf(dict(model_config))  # refuses what it cannot convert, saying what
        try:
            architecture.check_split(tensor, pipeline)
        except ConfigError as exc:
            return str(exc)
    return None


def check_layout(
    cfg: TrainerConfig,
    model_config: Mapping[str, Any] | None,
    devices: int | None = None,
    *,
    cpus: int | None = None,
    device_bytes: int | None = None,
    micro_tokens: int = 0,
    longest_tokens: int = 0,
) -> None:
    """Raise ConfigError saying what does not fit and what would, unless ``cfg``'s core cell layout fits the model of
    ``model_config`` (a ``config.json`` dict; None: the shapes are not checked) and the cell's machine.

    ``devices``: GPUs the cell has (nccl); ``cpus``: its CPU cores (gloo); ``device_bytes``: memory of one of its
    GPUs. None: this machine's (``torch.cuda``, ``os.cpu_count()``); ``cpus`` or ``device_bytes`` 0: not known (a
    cell placed on another machine), not checked. ``micro_tokens``: a micro-step's tokens, for the activations in the
    memory check (0: the state alone); ``longest_tokens``: the longest micro-step the run can make (its longest
    context), held by one rank up to ``trainer.max_tokens_per_rank`` and split over every rank of the cell past it
    (`rank_tokens`), so a cell that cannot hold it is refused before anything starts.
    """
    t, p, s = cfg.tensor_parallel, cfg.pipeline_parallel, cfg.ranks
    if cfg.backend == "megatron" and s > 1:
        raise ConfigError(
            f"trainer.ranks = {s} with trainer.backend = 'megatron': the sharded core cell is built for the torch "
            f"backend only (Megatron's distributed optimizer is not wired in yet); set trainer.backend = 'torch' "
            f"(with tensor_parallel = pipeline_parallel = 1), or trainer.ranks = 1"
        )
    if cfg.backend == "torch" and (t > 1 or p > 1):
        raise ConfigError(
            f"trainer.tensor_parallel = {t}, trainer.pipeline_parallel = {p} with trainer.backend = 'torch': "
            f"tensor and pipeline parallel apply to the Megatron backend only (a torch rank computes a whole model "
            f"replica); set trainer.backend = 'megatron', or split the optimizer state with trainer.ranks instead"
        )
    if model_config is not None:
        _check_shapes(cfg, model_config)
    if cfg.collective == "nccl":
        _check_gpus(cfg, model_config, devices, device_bytes, micro_tokens, longest_tokens)
    else:
        _check_cpus(cfg, (os.cpu_count() or 1) if cpus is None else cpus)


def _check_shapes(cfg: TrainerConfig, model_config: Mapping[str, Any]) -> None:
    t, p = cfg.tensor_parallel, cfg.pipeline_parallel
    why = _shape_error(cfg, model_config, t, p)
    if why is None:
        return
    shape = model_shape(model_config)
    fitting_t = [n for n in range(1, shape.num_heads + 1) if _shape_error(cfg, model_config, n, 1) is None]
    fitting_p = [n for n in range(1, shape.num_layers + 1) if _shape_error(cfg, model_config, 1, n) is None]
    raise ConfigError(
        f"the core cell's layout ({_layout_text(cfg)}) does not fit the model: {why}; tensor_parallel values that "
        f"fit: {', '.join(map(str, fitting_t))}; pipeline_parallel values that fit: {_listed(fitting_p)}"
    )


def _listed(values: list[int], most: int = 12) -> str:
    shown = ", ".join(map(str, values[:most]))
    return shown + (f", ... {values[-1]}" if len(values) > most else "")


def _check_gpus(
    cfg: TrainerConfig,
    model_config: Mapping[str, Any] | None,
    devices: int | None,
    device_bytes: int | None,
    micro_tokens: int,
    longest_tokens: int = 0,
) -> None:
    """nccl: one GPU per rank, and (the sharded core) its state and the longest micro-step's share of activations in
    a GPU's memory."""
    where = "this machine has" if devices is None else "the cell has"
    if devices is None or device_bytes is None:
        import torch

        if devices is None:
            devices = torch.cuda.device_count()
        if device_bytes is None and torch.cuda.is_available():
            device_bytes = min(
                torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())
            )
    ranks = cfg.tensor_parallel * cfg.pipeline_parallel * cfg.ranks
    if ranks > devices:
        per_shard = cfg.tensor_parallel * cfg.pipeline_parallel
        would = (
            f"trainer.ranks = {devices // per_shard} fits"
            if devices >= per_shard
            else "no layout of these tensor_parallel x pipeline_parallel fits"
        )
        raise ConfigError(
            f"the core cell's layout ({_layout_text(cfg)}) needs {ranks} GPUs over trainer.collective = 'nccl' (one "
            f"per rank), and {where} {devices}; {would}, or use trainer.collective = 'gloo' on CPU"
        )
    if model_config is None or not device_bytes or cfg.backend != "torch" or cfg.ranks == 1:
        return  # the memory check is of the sharded torch core; today's one-process core keeps its state on the host
    shape = model_shape(model_config)

    def tokens(shards: int) -> int:
        return max(micro_tokens, rank_tokens(cfg.max_tokens_per_rank, longest_tokens, shards))

    held = _projected(cfg, shape, cfg.ranks, device_bytes, tokens(cfg.ranks))
    if held.fits:
        return
    # a cell is one machine: more ranks than its GPUs are no answer
    more = next(
        (
            n
            for n in range(cfg.ranks + 1, devices + 1)
            if _projected(cfg, shape, n, device_bytes, tokens(n)).fits
        ),
        None,
    )
    micro_tokens = tokens(cfg.ranks)
    unsplit = longest_tokens > 0 and not cfg.max_tokens_per_rank
    would = (
        f"trainer.ranks = {more} would fit ({more} of the cell's {devices} GPUs)"
        if more is not None
        else f"one rank computes the longest micro-step ({longest_tokens} tokens) whole: set "
        f"trainer.max_tokens_per_rank to split a longer one over the cell's ranks (context parallelism)"
        if unsplit
        else f"with up to the cell's {devices} GPUs a rank's share of the longest micro-step ({longest_tokens} tokens) "
        f"does not fit beside the state: a shorter engine.context_length, or more GPUs' memory"
        if longest_tokens and _projected(cfg, shape, devices, device_bytes, 0).fits
        else f"no number of ranks up to the cell's {devices} GPUs fits: every rank holds a whole fp32 replica and its "
        f"gradient ({_gib(2 * held.weights + held.push)} GiB with the push bucket); the model needs GPUs with more "
        f"memory, or tensor/pipeline parallel or a bf16 replica, which the sharded core does not have yet"
    )
    longest = (
        f" (a rank's share of the longest micro-step, {longest_tokens} tokens)"
        if longest_tokens and micro_tokens < longest_tokens
        else ""
    )
    activations = (
        f", {_gib(held.activations + held.logits)} activations of {micro_tokens} tokens{longest}"
        if micro_tokens
        else "; activations not counted"
    )
    raise ConfigError(
        f"the core cell's layout ({_layout_text(cfg)}) does not fit a GPU's memory: each rank needs at least "
        f"{_gib(held.total)} GiB ({_gib(held.weights)} replica, {_gib(held.gradients)} gradients, "
        f"{_gib(held.master)} master, {_gib(held.moments)} AdamW moments, {_gib(held.push)} push bucket"
        f"{activations}) of {_gib(held.usable_bytes)} GiB usable (90% of {_gib(device_bytes)} GiB); {would}"
    )


def rank_tokens(max_tokens_per_rank: int, longest_tokens: int, shards: int) -> int:
    """The most tokens one rank of a cell of ``shards`` ranks computes at once for micro-steps of up to
    ``longest_tokens``: a longer one than ``max_tokens_per_rank`` (0: none is split) is split over all of them."""
    if max_tokens_per_rank and longest_tokens > max_tokens_per_rank:
        return max(max_tokens_per_rank, -(-longest_tokens // shards))
    return longest_tokens


def _projected(
    cfg: TrainerConfig, shape: ModelShape, shards: int, device_bytes: int, micro_tokens: int
) -> DeviceMemory:
    layout = CellLayout(
        tensor=cfg.tensor_parallel, pipeline=cfg.pipeline_parallel, shards=shards, device_bytes=device_bytes
    )
    precision = dataclasses.replace(SHARDED_TORCH, local_sum=LOCAL_SUM_BYTES[cfg.accumulation])
    return device_memory(
        shape, layout, precision, micro_tokens, bucket_bytes=int(cfg.bucket_mib * 2**20), engine_bytes=2
    )


def _gib(n: int) -> str:
    return f"{n / GIB:.1f}"


def _check_cpus(cfg: TrainerConfig, cpus: int) -> None:
    ranks = cfg.tensor_parallel * cfg.pipeline_parallel * cfg.ranks
    if cpus and ranks > RANKS_PER_CPU * cpus:
        raise ConfigError(
            f"the core cell's layout ({_layout_text(cfg)}) would run {ranks} rank processes over gloo on "
            f"{cpus} CPU cores, more than {RANKS_PER_CPU} a core: each rank computes on a whole model replica, so "
            f"they would only wait on each other; use at most {RANKS_PER_CPU * cpus} ranks, or trainer.collective = "
            f"'nccl' on GPUs"
        )


def describe_layout(cfg: TrainerConfig, model_config: Mapping[str, Any]) -> str:
    """One line for logs: the core cell's ranks and what each holds of the model's optimizer state."""
    t, p, s = cfg.tensor_parallel, cfg.pipeline_parallel, cfg.ranks
    count = _count(model_shape(model_config).parameters())
    ranks = t * p * s
    if s == 1:
        held = f"it holds all {count}" if ranks == 1 else f"the core process holds all {count}"
    else:
        held = f"each holds 1/{s} of {count}"
    return (
        f"core cell: {s} rank{'s' if s > 1 else ''} x tensor {t} x pipeline {p} = {ranks} "
        f"rank process{'es' if ranks > 1 else ''}; "
        f"{held} fp32 master weights, gradient sum and AdamW moments"
    )


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)


def check_run_layout(
    cfg: TrainerConfig, model_dir: str | Path, ray_cell_gpus: float | None = None, context_tokens: int = 0
) -> str:
    """`check_layout` for a run's core cell training the model in ``model_dir``; returns `describe_layout`'s line
    (or the layout alone when the directory has no ``config.json``). ``ray_cell_gpus``: the cell runs where Ray
    places it, with this many GPUs (``[ray] cell_gpus``); None: on this machine. ``context_tokens``: the longest
    context the engines serve (0: the model's ``max_position_embeddings``), which bounds the longest micro-step."""
    model_config = read_model_config(model_dir)
    longest = context_tokens or int((model_config or {}).get("max_position_embeddings") or 0)
    if ray_cell_gpus is None:
        check_layout(cfg, model_config, longest_tokens=longest)
    else:
        check_layout(
            cfg, model_config, math.floor(ray_cell_gpus), cpus=0, device_bytes=0, longest_tokens=longest
        )
    line = f"core cell: {_layout_text(cfg)}" if model_config is None else describe_layout(cfg, model_config)
    if cfg.collective == "nccl" and cfg.backend == "torch" and cfg.ranks > 1:
        line += f"; {NOT_YET_ON_GPUS}"
    return line

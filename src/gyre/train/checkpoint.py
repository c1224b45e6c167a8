"""Checkpoints that never need the whole model in one process: a streamed Hugging Face export, sharded optimizer state.

Two halves, each usable by a core that holds only its shard of the model:

- ``export_weights`` writes ``(name, tensor)`` pairs as they come (a sharded core gathers each tensor from its shards
  just in time) into safetensors files of at most ``max_shard_bytes`` each, plus ``model.safetensors.index.json``:
  the layout transformers, SGLang and the embedded engine read. Each tensor is written straight to its place in its
  file (the file's header space is reserved when the file opens and filled in when it closes), so the extra memory is
  one tensor, and none when the tensor already is contiguous CPU memory of the export dtype. A model that fits one
  file gets ``model.safetensors`` and no index, as ``save_pretrained`` writes it, so small models keep today's layout.
- ``save_flat_state`` / ``load_flat_state`` keep a distributed (ZeRO-1) optimizer's state in
  ``torch.distributed.checkpoint`` (DCP: one ``__<rank>_0.distcp`` file per rank plus ``.metadata``). The state is
  flat buffers laid out like ``state.flatten_parameters`` (fp32 master weights, AdamW's ``exp_avg`` and
  ``exp_avg_sq``), each rank holding the ``flat_range`` slice of every buffer, and 0-d tensors every rank holds alike
  (AdamW's step). The slices travel as DTensors sharded on dimension 0, so DCP reshards by itself: a run saved by N
  ranks loads on M, reading only the pieces that overlap each rank's slice, and one process (``group=None``) saves or
  loads the whole buffers.

Why the export is written here rather than by DCP's ``HuggingFaceStorageWriter`` (torch 2.13): that writer takes a
whole state dict at once and a tensor-to-file mapping decided up front, not tensors as they come; a distributed save
with it writes each rank's pieces and then consolidates them into full files, a second pass over every byte; and a
ZeRO-1 flat range cuts through parameters, which per-parameter DTensors cannot express.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from gyre.errors import ConfigError

STATE_FILE = "trainer_state.json"  # step, version, data cursor, metrics, parameter names (rank 0 writes it)
OPTIMIZER_DIR = "optimizer"  # the flat state in torch.distributed.checkpoint (every rank writes its file)
LEGACY_OPTIMIZER_FILE = "optimizer.safetensors"  # AdamW state per parameter (earlier checkpoints: read only)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_SHARD_BYTES = (
    5 * 2**30
)  # one weights file's data, at most (transformers' default is 5 GB); one bigger tensor
# goes alone in its file
HEADER_RESERVE_BYTES = (
    256 * 2**10
)  # header space a weights file reserves; a file closes early when it is full
# (Qwen3-8B's 399 tensors need about 60 KiB in all)

_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}  # fmt: skip


def model_tensors(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """A model's ``state_dict`` as (name, tensor) pairs, a tied weight once, under its first name."""
    seen: set[tuple[int, int]] = set()
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tensor.numel())
        if key not in seen:
            seen.add(key)
            yield name, tensor


class _File:
    """One safetensors file being written: header space reserved up front, tensors appended as they come."""

    def __init__(self, path: Path, reserve: int) -> None:
        self.path, self.reserve = path, reserve
        self.header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        self.header_bytes = len(json.dumps(self.header, separators=(",", ":")))
        self.size = 0  # bytes of tensor data written
        self.file = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.file.seek(8 + reserve)

    def fits(self, name: str, tensor: torch.Tensor, max_bytes: int) -> bool:
        """Whether ``tensor`` goes in this file (an empty file takes any tensor whose header entry fits)."""
        nbytes = tensor.numel() * tensor.element_size()
        header = self.header_bytes + _entry_bytes(name, self._entry(tensor))
        return header <= self.reserve and (len(self.header) == 1 or self.size + nbytes <= max_bytes)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        entry = self._entry(tensor)
        if (
            self.header_bytes + _entry_bytes(name, entry) > self.reserve
        ):  # alone in its file, with a huge name
            raise ConfigError(
                f"tensor name {name[:80]}... does not fit a {self.reserve}-byte safetensors header"
            )
        self.file.write(tensor.reshape(-1).view(torch.uint8).numpy().data)  # no copy: the tensor's own bytes
        self.header[name] = entry
        self.header_bytes += _entry_bytes(name, entry)
        self.size = entry["data_offsets"][1]

    def _entry(self, tensor: torch.Tensor) -> dict[str, Any]:
        end = self.size + tensor.numel() * tensor.element_size()
        return {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [self.size, end]}

    def close(self) -> None:
        """Fill in the header (JSON padded with spaces to the reserved size, as the format allows) and close."""
        text = json.dumps(self.header, separators=(",", ":")).encode()
        self.file.seek(0)
        self.file.write(self.reserve.to_bytes(8, "little") + text + b" " * (self.reserve - len(text)))
        self.file.close()


def _entry_bytes(name: str, entry: dict[str, Any]) -> int:
    return len(json.dumps({name: entry}, separators=(",", ":"))) - 1  # less the braces, plus one comma


def export_weights(
    directory: str | Path,
    tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    dtype: torch.dtype | None = None,
    header_reserve_bytes: int = HEADER_RESERVE_BYTES,
) -> list[Path]:
    """Write ``tensors`` (consumed one at a time, in order) into ``directory`` as Hugging Face safetensors weights:
    ``model.safetensors`` when they fit one file of ``max_shard_bytes``, else ``model-0000k-of-0000n.safetensors``
    and ``model.safetensors.index.json``. ``dtype``: convert each tensor to it (None: keep each tensor's own).
    Returns the files written, in order."""
    if header_reserve_bytes % 8:
        raise ValueError("header_reserve_bytes must be a multiple of 8 (the data stays 8-byte aligned)")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    files: list[_File] = []
    names: set[str] = set()
    try:
        for name, tensor in tensors:
            if name in names:
                raise ValueError(f"tensor {name} is exported twice")
            names.add(name)
            # one tensor at most (none for contiguous CPU memory of the dtype); one dtype keeps every tensor aligned
            data = tensor.detach().to("cpu", dtype or tensor.dtype).contiguous()
            if not files or not files[-1].fits(name, data, max_shard_bytes):
                if files:
                    files[-1].close()
                files.append(_File(path / f"model.part-{len(files) + 1:05d}", header_reserve_bytes))
            files[-1].write(name, data)
            del data, tensor  # nothing of this tensor is held while the next one is made
        if not files:
            raise ValueError("no tensors to export")
        files[-1].close()
    except BaseException:
        for f in files:
            f.file.close()
            f.path.unlink(missing_ok=True)
        raise
    if len(files) == 1:
        final = [path / SINGLE_FILE]
    else:
        final = [path / f"model-{k:05d}-of-{len(files):05d}.safetensors" for k in range(1, len(files) + 1)]
    weight_map: dict[str, str] = {}
    for f, target in zip(files, final, strict=True):
        os.replace(f.path, target)
        weight_map.update(dict.fromkeys((n for n in f.header if n != "__metadata__"), target.name))
    (path / (INDEX_FILE if len(files) == 1 else SINGLE_FILE)).unlink(missing_ok=True)  # an earlier export's
    if len(files) > 1:
        index = {"metadata": {"total_size": sum(f.size for f in files)}, "weight_map": weight_map}
        (path / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return final


# ---- sharded optimizer state (torch.distributed.checkpoint) ----------------------------------------------------------
def flat_range(numel: int, rank: int, world: int) -> tuple[int, int]:
    """The [start, stop) of a ``numel``-long flat buffer that ``rank`` of ``world`` holds: ``torch.chunk``'s split,
    which DTensor's ``Shard(0)`` uses (ceil(numel / world) each, the last ranks less or nothing)."""
    size = math.ceil(numel / world)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


def _as_dtensors(shards: dict[str, torch.Tensor], numel: int, group: Any) -> dict[str, Any]:
    """This rank's slices as DTensors over ``group`` (0-d tensors stay plain: every rank holds them alike)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    start, stop = flat_range(numel, rank, world)
    mesh: DeviceMesh | None = None
    out: dict[str, Any] = {}
    for key, tensor in shards.items():
        if tensor.dim() == 0:
            out[key] = tensor
            continue
        if tensor.shape != (stop - start,):
            raise ValueError(
                f"{key}: rank {rank} of {world} holds [{start}, {stop}) of {numel}, not {tensor.shape}"
            )
        mesh = mesh or DeviceMesh.from_group(group, tensor.device.type)
        out[key] = DTensor.from_local(tensor, mesh, [Shard(0)], shape=torch.Size([numel]), stride=(1,))
    return out


@contextlib.contextmanager
def _one_process() -> Iterator[None]:
    """DCP without a process group, without its warning that this is meant (it is)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def save_flat_state(
    directory: str | Path, shards: dict[str, torch.Tensor], numel: int, *, group: Any = None
) -> None:
    """Save this rank's ``flat_range`` slices of ``numel``-long flat buffers (1-d tensors) and the 0-d tensors every
    rank holds alike, with every rank of ``group`` calling at once. ``group=None``: one process holding whole
    buffers."""
    import torch.distributed.checkpoint as dcp

    path = Path(directory)
    if group is None:
        for key, tensor in shards.items():
            if tensor.dim() and tensor.shape != (numel,):
                raise ValueError(f"{key}: one process saves whole buffers of {numel}, not {tensor.shape}")
        with _one_process():
            dcp.save(dict(shards), checkpoint_id=path, no_dist=True)
    else:
        dcp.save(_as_dtensors(shards, numel, group), checkpoint_id=path, process_group=group)


def flat_state_keys(directory: str | Path, numel: int) -> dict[str, tuple[torch.dtype, bool]]:
    """What a flat state checkpoint holds: each key's dtype and whether it is a flat buffer (else a 0-d tensor).
    Refuses, saying why, a directory that is not one or that is for a model of another size."""
    import torch.distributed.checkpoint as dcp

    path = Path(directory)
    if not (path / ".metadata").is_file():
        raise ConfigError(
            f"{path} is not a sharded optimizer state (no .metadata of torch.distributed.checkpoint)"
        )
    metadata = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    keys: dict[str, tuple[torch.dtype, bool]] = {}
    for key, item in metadata.items():
        if not isinstance(item, dcp.TensorStorageMetadata):
            raise ConfigError(f"{path}: {key} is not a tensor; not a flat optimizer state")
        if tuple(item.size) not in ((), (numel,)):
            raise ConfigError(
                f"{path}: {key} is for a model of {tuple(item.size)} values; this one has {numel}"
            )
        keys[key] = (item.properties.dtype, len(item.size) == 1)
    return keys


def load_flat_state(
    directory: str | Path, numel: int, *, group: Any = None, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """This rank's ``flat_range`` slices of the flat buffers saved in ``directory`` (by any number of ranks), and
    its 0-d tensors, with every rank of ``group`` calling at once. ``group=None``: the whole buffers."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    path = Path(directory)
    keys = flat_state_keys(path, numel)
    if group is None:
        start, stop = 0, numel
    else:
        start, stop = flat_range(numel, dist.get_rank(group), dist.get_world_size(group))
    local = {key: torch.empty((stop - start,) if flat else (), dtype=dtype, device=device)
             for key, (dtype, flat) in keys.items()}  # fmt: skip
    if group is None:
        with _one_process():
            dcp.load(local, checkpoint_id=path, no_dist=True)
        return local
    targets = _as_dtensors(local, numel, group)
    dcp.load(targets, checkpoint_id=path, process_group=group)  # fills each DTensor's local tensor in place
    for key, target in targets.items():  # a 0-d tensor may have been replaced rather than filled
        if target.dim() == 0:
            local[key] = target
    return local


# ---- a whole checkpoint ------------------------------------------------------------------------------------------
_NOT_COPIED = ("config.json", INDEX_FILE, STATE_FILE)  # besides weights: what a checkpoint writes itself


def save_checkpoint(
    directory: str | Path,
    *,
    config: Any,
    source: str | Path,
    tensors: Iterable[tuple[str, torch.Tensor]],
    flat: dict[str, torch.Tensor],
    numel: int,
    state: dict[str, Any],
    group: Any = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write a checkpoint directory, replacing what ``directory`` held, with every rank of ``group`` calling at once
    (``group=None``: one process). ``directory`` must be on a filesystem every rank sees.

    It loads as a Hugging Face model (``config``'s ``config.json``, the weights ``tensors`` yields, exported by
    ``export_weights`` on rank 0 in ``dtype``, and the tokenizer files of ``source``), plus ``optimizer/`` (``flat``:
    this rank's slices and 0-d tensors, see ``save_flat_state``) and ``trainer_state.json`` (``state``). ``tensors``
    is consumed on every rank, in lockstep (gathering a tensor from shards is a collective); only rank 0 writes it.
    """
    import torch.distributed as dist

    path = Path(directory)
    tmp = path.with_name(path.name + ".partial")
    rank = 0 if group is None else dist.get_rank(group)
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    if group is not None:
        dist.barrier(group)  # no rank writes into tmp before rank 0 has emptied it
    save_flat_state(tmp / OPTIMIZER_DIR, flat, numel, group=group)
    if rank == 0:
        export_weights(tmp, tensors, max_shard_bytes=max_shard_bytes, dtype=dtype)
        config.save_pretrained(tmp)
        for item in Path(source).iterdir():  # the tokenizer and chat template travel with the weights
            if item.is_file() and item.name not in _NOT_COPIED and not item.name.endswith(".safetensors"):
                shutil.copy2(item, tmp / item.name)
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
    else:
        for _ in tensors:
            pass
    if group is not None:
        dist.barrier(group)  # every rank returns once the checkpoint is whole
    return path


def read_state(directory: str | Path) -> dict[str, Any]:
    """The ``trainer_state.json`` of the checkpoint at ``directory``; refuses a directory that is not one."""
    path = Path(directory) / STATE_FILE
    if not path.is_file():
        raise ConfigError(f"{path.parent} is not a Gyre checkpoint (no {STATE_FILE})")
    state: dict[str, Any] = json.loads(path.read_text())
    return state

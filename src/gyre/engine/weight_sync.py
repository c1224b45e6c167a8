"""Weight transfer groups between a trainer (rank 0) and inference engines over torch.distributed.

Groups are built from a ``TCPStore`` directly, never through the default process group, so a trainer that already
runs data parallelism and an engine process can both join any number of them. Gloo on CPU, NCCL on GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import threading
from collections.abc import Coroutine, Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import msgspec
import torch
import torch.distributed as dist

from gyre.errors import ConfigError
from gyre.protocol import format_weight_version

if TYPE_CHECKING:
    from gyre.engine.engineclient import EngineClient

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the form the update request carries)."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` or ``"torch.bfloat16"`` -> ``torch.bfloat16``."""
    dtype = DTYPES.get(name.removeprefix("torch."))
    if dtype is None:
        raise ConfigError(f"unsupported weight dtype {name!r}; use one of {sorted(DTYPES)}")
    return dtype


def create_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str = "gloo",
    timeout_s: float = 120.0,
) -> WeightGroup:
    """Join (rank 0: host) a weight-transfer group; blocks until all ``world_size`` ranks arrived."""
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(
        master_address, master_port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False
    )
    # The key layout SGLang's init_custom_process_group produces (group name, then torch's group and device
    # prefixes), so a trainer built on this module also meets a real SGLang server.
    device = {"gloo": "cpu", "nccl": "cuda"}.get(backend)
    if device is None:
        raise ConfigError(f"weight update backend {backend!r} is not supported; use gloo or nccl")
    prefixed = dist.PrefixStore(
        f"{device}/", dist.PrefixStore(f"{group_name}/", dist.PrefixStore(group_name, store))
    )
    pg: Any
    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        options._timeout = timeout
        options._devices = [_gloo_device(master_address)]
        pg = dist.ProcessGroupGloo(prefixed, rank, world_size, options)
    else:
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
    return WeightGroup(pg, store, rank, world_size, timeout_s)


def _gloo_device(master_address: str) -> Any:
    """The interface gloo's pair listens on: ``GLOO_SOCKET_IFNAME`` if set, else this machine's address on the
    route to the master (gloo's own default resolves the hostname, which on many hosts is 127.0.1.1: a peer on
    another machine could not connect back)."""
    interface = os.environ.get("GLOO_SOCKET_IFNAME", "")
    if interface:
        return dist.ProcessGroupGloo.create_device(interface=interface.split(",")[0])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((master_address, 9))  # no packet is sent: only the route is looked up
        return dist.ProcessGroupGloo.create_device(hostname=probe.getsockname()[0])


class WeightGroup:
    """A joined weight-transfer group; keeps its rendezvous store alive as long as the group."""

    def __init__(self, pg: Any, store: Any, rank: int, world_size: int, timeout_s: float = 120.0) -> None:
        self.pg, self.store, self.rank, self.world_size = pg, store, rank, world_size
        self.timeout_s = timeout_s  # one collective's deadline (the group's own)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        """Broadcast ``tensor`` from rank ``src`` into every rank's tensor of the same shape (blocking)."""
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        self.pg.broadcast([tensor], opts).wait()


class PushStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What one `push_weights` moved, and the memory it cost the sender beyond the weights themselves."""

    buckets: int  # update calls (and collective rounds) the push took
    sent_bytes: int  # the weights' bytes sent
    largest_bucket_bytes: int  # the largest bucket's bytes (at most max(bucket_bytes, largest tensor))
    copied_bytes_max: int  # the largest send buffer built by copying (0: all were views of the weights)


def plan_buckets(sizes: Sequence[int], bucket_bytes: int | None) -> list[range]:
    """Consecutive index ranges of ``sizes`` (bytes per tensor), each at most ``bucket_bytes`` in total, except a
    tensor larger than a bucket, which goes alone; None: one bucket of everything. Order is kept."""
    if bucket_bytes is not None and bucket_bytes <= 0:
        raise ConfigError(f"bucket_bytes = {bucket_bytes}: a bucket holds at least one byte")
    out: list[range] = []
    start, filled = 0, 0
    for i, size in enumerate(sizes):
        if bucket_bytes is not None and i > start and filled + size > bucket_bytes:
            out.append(range(start, i))
            start, filled = i, 0
        filled += size
    if sizes:
        out.append(range(start, len(sizes)))
    return out


async def push_weights(
    client: EngineClient,
    group: WeightGroup,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    weight_version: int,
    group_name: str = "weight_update_group",
    flattened: bool = False,
    bucket_bytes: int | None = None,
) -> PushStatistics:
    """Trainer side: send weights to one engine through an initialised group (rank 0 here), in buckets.

    Each bucket of at most ``bucket_bytes`` (a tensor larger than that goes alone; None: one bucket) is one
    ``/update_weights_from_distributed`` call, told its names, dtypes and shapes over HTTP while the tensors are
    broadcast from a worker thread: one broadcast per tensor, or with ``flattened`` one of their bytes (SGLang's
    ``flattened_bucket``; no copy when they already lie back to back in one buffer). Only the last call carries
    ``weight_version``, and the others say how many follow (``buckets_left``): an engine serves the new version once
    all of it is in, and one left with part of a push (the sender died) never claims it. A flattened bucket is
    built only when it is sent, so the sender's extra memory is one bucket, never the model.
    """
    format_weight_version(weight_version)  # refused before any tensor moves
    tensors = [(name, t.detach()) for name, t in named_tensors]
    sizes = [t.numel() * t.element_size() for _, t in tensors]
    plan = plan_buckets(sizes, bucket_bytes) or [range(0)]  # nothing to send: one call still sets the version
    copied = 0
    async with client.weight_update():  # SGLang's session spans the buckets: it post-processes at the end
        for n, bucket in enumerate(plan):
            chunk = [tensors[i] for i in bucket]
            last = n == len(plan) - 1
            request = client.update_weights_from_distributed(
                names=[name for name, _ in chunk],
                dtypes=[dtype_name(t.dtype) for _, t in chunk],
                shapes=[list(t.shape) for _, t in chunk],
                group_name=group_name,
                weight_version=weight_version if last else None,
                load_format="flattened_bucket" if flattened else None,
                buckets_left=len(plan) - 1 - n,
            )
            copied = max(copied, await _send_bucket(request, group, [t for _, t in chunk], flattened))
    return PushStatistics(
        buckets=len(plan),
        sent_bytes=sum(sizes),
        largest_bucket_bytes=max((sum(sizes[i] for i in b) for b in plan), default=0),
        copied_bytes_max=copied,
    )


async def _send_bucket(
    request: Coroutine[Any, Any, str], group: WeightGroup, tensors: list[torch.Tensor], flattened: bool
) -> int:
    """One bucket: the engine receives (``request``) while a worker thread broadcasts; returns the bytes the send
    buffer copied (0: views of the weights only)."""
    loop = asyncio.get_running_loop()
    sent: asyncio.Future[int] = loop.create_future()

    def send() -> None:
        error: BaseException | None = None
        copied = 0
        try:  # the buffers live in this frame only: freed before the next bucket is built
            if flattened and tensors:
                flat = flat_bytes(tensors)
                copied = 0 if _is_view(flat, tensors) else flat.numel()
                group.broadcast(flat)
                del flat
            else:
                for t in tensors:
                    dense = t.contiguous()
                    if dense.data_ptr() != t.data_ptr():
                        copied = max(copied, dense.numel() * dense.element_size())
                    group.broadcast(dense)
                    del dense
        except BaseException as exc:  # handed to the awaiting side
            error = exc if isinstance(exc, Exception) else RuntimeError(f"the weight sender stopped: {exc!r}")
        loop.call_soon_threadsafe(_settle, sent, copied, error)

    async def sending() -> None:
        await asyncio.shield(sent)  # a cancelled push does not cancel the send: it waits for it below

    # its own thread, not the loop's executor: a push cut short still waits for it (below), so it must have started
    threading.Thread(target=send, name="gyre-weight-send", daemon=True).start()
    try:  # the engine receives while we send; either failing ends both
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(request)
            tasks.create_task(sending())
    finally:
        if not sent.done():  # cut short (a deadline, the request failed): the tensors are ours until sent
            with contextlib.suppress(Exception):  # the group's own timeout ends the send
                await asyncio.shield(sent)
    return sent.result()


def _is_view(flat: torch.Tensor, tensors: list[torch.Tensor]) -> bool:
    return flat.untyped_storage().data_ptr() == tensors[0].untyped_storage().data_ptr()


def _settle(future: asyncio.Future[int], result: int, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(result)
    else:
        future.set_exception(exc)


def flat_bytes(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The bytes of ``tensors`` concatenated, as one uint8 tensor: a view when they lie back to back in one
    storage (a trainer's flat parameter buffer), else a copy."""
    first = tensors[0]
    storage = first.untyped_storage()
    at = first.storage_offset() * first.element_size()
    start = at
    for t in tensors:
        if not t.is_contiguous() or t.untyped_storage().data_ptr() != storage.data_ptr():
            break
        if t.storage_offset() * t.element_size() != at:
            break
        at += t.numel() * t.element_size()
    else:
        return torch.empty(0, dtype=torch.uint8, device=first.device).set_(
            storage, start, (at - start,), (1,)
        )
    return torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])


def split_bytes(flat: torch.Tensor, dtypes: list[torch.dtype], shapes: list[list[int]]) -> list[torch.Tensor]:
    """The tensors a ``flattened_bucket`` holds, as views of ``flat`` (see `flat_bytes`)."""
    out, at = [], 0
    for dtype, shape in zip(dtypes, shapes, strict=True):
        size = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        out.append(flat[at : at + size].view(dtype).view(shape))
        at += size
    if at != flat.numel():
        raise ValueError(f"a flattened bucket of {flat.numel()} bytes described as {at}")
    return out

"""The embedded engine: a model, a scheduler stepping on its own thread, and an async API around them.

The engine thread owns all model and cache state; the event loop never blocks on a forward pass. Requests go in
through a queue, news come back once per step through ``loop.call_soon_threadsafe``; every other operation (abort,
pause, weight update, memory release, KV export) runs on the engine thread between two steps.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import json
import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import torch

from gyre.config import EngineConfig
from gyre.engine import weight_sync
from gyre.engine.embedded.device import auto_threads, keep_freed_memory_in_heap, resolve_device
from gyre.engine.embedded.grammar import Grammars
from gyre.engine.embedded.scheduler import Request, Scheduler
from gyre.engine.embedded.transformer import ModelSpec, TransformerLM
from gyre.errors import ConfigError, EngineCapacityError, EngineError, EngineRequestError, ProtocolError
from gyre.protocol import (
    GenerateMeta,
    GenerateRequest,
    GenerateResponse,
    InitWeightsUpdateGroupRequest,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
    parse_weight_version,
)

log = logging.getLogger(__name__)
R = TypeVar("R")


class EngineStatistics(msgspec.Struct, frozen=True):
    """A snapshot of the engine's load and counters."""

    running_requests: int
    waiting_requests: int
    kv_slots_total: int
    kv_slots_free: int
    cached_tokens: int
    steps: int
    generated_tokens: int
    prefill_tokens: int
    cached_prompt_tokens: int
    retracted_requests: int
    paused: bool
    released: list[str]
    weight_version: int
    receive_buffer_bytes_max: int = (
        0  # a weight group's kept buffer for flattened buckets: its largest bucket
    )


class _Sink:
    """Asyncio side of one request: woken at each step that brings it news."""

    __slots__ = ("event", "req", "seen")

    def __init__(self, req: Request) -> None:
        self.req = req
        self.event = asyncio.Event()
        self.seen = 0


class _Push:
    """A push in buckets between two of its calls: the hold on requests it keeps, and the deadline for its next."""

    __slots__ = ("done", "group_name", "timer")

    def __init__(self, group_name: str, done: asyncio.Event) -> None:
        self.group_name, self.done = group_name, done
        self.timer: asyncio.TimerHandle | None = None

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


class EmbeddedEngine:
    """In-process inference engine with SGLang's semantics; ``gyre serve-engine`` puts HTTP in front of it."""

    def __init__(self, cfg: EngineConfig) -> None:
        if not cfg.model_path:
            raise ConfigError("engine.model_path is empty: point it at a Hugging Face model directory")
        self.cfg = cfg
        self.device, self.dtype = resolve_device(cfg)
        self.spec = ModelSpec.from_dir(cfg.model_path)
        self.num_threads = cfg.num_threads or auto_threads(self.spec)
        if self.device.type == "cpu":
            keep_freed_memory_in_heap()
        self.model = TransformerLM(self.spec, self.device, self.dtype)
        self.model.load_dir(cfg.model_path)
        self.tokenizer = _load_tokenizer(cfg.model_path)
        self.context_length = cfg.context_length or self.spec.max_position_embeddings
        bytes_per_slot = (
            2 * self.spec.num_layers * self.spec.num_kv_heads * self.spec.head_dim * self.dtype.itemsize
        )
        kv_slots = int(cfg.kv_cache_mem_gib * 2**30) // bytes_per_slot
        # decode lanes take an eighth; growing them briefly holds old and new storage, hence 2/3 of it in lanes
        lane_slots = kv_slots // 8 if cfg.decode_lanes else 0
        kv_slots -= lane_slots
        if kv_slots < 16:
            raise ConfigError(
                f"engine.kv_cache_mem_gib = {cfg.kv_cache_mem_gib} holds only {kv_slots} tokens"
            )
        self.scheduler = Scheduler(
            self.model,
            kv_slots=kv_slots,
            max_running=cfg.max_running_requests,
            max_prefill_tokens=cfg.max_prefill_tokens,
            context_length=self.context_length,
            enable_prefix_cache=cfg.enable_prefix_cache,
            seed=cfg.seed,
            decode_text=self._decode if self.tokenizer is not None else None,
            lane_positions=lane_slots * 2 // 3,
        )
        self.grammars = (  # xgrammar is imported at the first constrained request
            Grammars(self.tokenizer, self.spec.vocab_size, self.spec.eos_token_ids)
            if self.tokenizer is not None
            else None
        )
        self.scheduler.grammars = self.grammars
        self.weight_version: int = cfg.weight_version  # SGLang's API carries it as a (decimal) string
        self._weights_source = (cfg.model_path, self.weight_version)  # what a memory resume reloads
        self._released: set[str] = set()
        self._groups: dict[str, weight_sync.WeightGroup] = {}
        self._torn = ""  # why the weights are part one version, part another (an update broke off)
        self._bucket: dict[str, torch.Tensor] = {}  # group -> receive buffer of flattened weight updates
        self._push: _Push | None = None  # a push in buckets between two of its calls: it holds requests
        self._incoming: deque[Request] = deque()
        self._commands: deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = deque()
        self._inflight: dict[str, Request] = {}
        self._update_done: asyncio.Event | None = None  # set while a weight update waits or runs
        self._idle: asyncio.Event | None = None  # set when the last request in flight ends
        self._wake = threading.Event()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rid_counter = itertools.count()
        self._thread = threading.Thread(target=self._run, name="gyre-engine", daemon=True)
        self._thread.start()

    # ---- engine thread --------------------------------------------------------------------------------------
    def _run(self) -> None:
        if self.device.type == "cpu":  # OpenMP's thread count belongs to the calling thread: set it here
            torch.set_num_threads(self.num_threads)
        sched = self.scheduler
        while not self._closed:
            if not sched.has_work():
                self._wake.wait()
            self._wake.clear()
            while self._commands:
                fn, fut = self._commands.popleft()
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except BaseException as exc:  # handed to the awaiting caller
                        fut.set_exception(exc)
            while self._incoming:
                req = self._incoming.popleft()
                try:
                    sched.add(req)
                except Exception as exc:  # a request the scheduler cannot take fails alone
                    req.finish = {"type": "abort", "message": f"request rejected: {exc}", "error": True}
                    self._publish([req])
            if not sched.has_work():
                continue
            started = time.perf_counter()
            try:
                news = sched.step()
            except Exception as exc:  # a bug or device failure: fail the batch, keep serving
                log.exception("engine step failed")
                news = self._fail_all(f"engine step failed: {exc!r}")
            news = [r for r in news if r.stream or r.finish is not None]  # others need no wake-up per token
            if news:
                self._publish(news)
            if self.cfg.modelled_step_s:  # a modelled device: a step costs the same at any batch, as on a GPU
                time.sleep(max(self.cfg.modelled_step_s - (time.perf_counter() - started), 0.0))

    def _fail_all(self, message: str) -> list[Request]:
        failed = list(self.scheduler.running) + list(self.scheduler.waiting)
        for req in failed:
            self.scheduler.abort(req, message)
            req.finish = {"type": "abort", "message": message, "error": True}
        return failed

    def _publish(self, news: list[Request]) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(_wake_sinks, news)

    def _call(self, fn: Callable[[], R]) -> asyncio.Future[R]:
        """Run ``fn`` on the engine thread between steps."""
        self._bind_loop()
        fut: concurrent.futures.Future[R] = concurrent.futures.Future()
        self._commands.append((fn, fut))
        self._wake.set()
        return asyncio.wrap_future(fut)

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop

    # ---- generation -----------------------------------------------------------------------------------------
    def _prepare(self, body: GenerateRequest) -> Request:
        if (body.text is None) == (body.input_ids is None):
            raise EngineRequestError("give exactly one of `text` and `input_ids`")
        if body.input_ids is not None:
            ids = list(body.input_ids)
            bad = [t for t in ids if not 0 <= t < self.spec.vocab_size]
            if bad:
                raise EngineRequestError(
                    f"input_ids holds {bad[0]}, outside the vocabulary [0, {self.spec.vocab_size})"
                )
        else:
            if self.tokenizer is None:
                raise EngineRequestError(
                    "this model directory has no tokenizer: send input_ids instead of text"
                )
            ids = self.tokenizer.encode(body.text, add_special_tokens=False)
        if not ids:
            raise EngineRequestError("the input is empty")
        if len(ids) >= self.context_length:
            raise EngineCapacityError(
                f"the input has {len(ids)} tokens; this engine's context length is {self.context_length}"
            )
        if len(ids) >= self.scheduler.kv_slots:
            raise EngineCapacityError(
                f"the input has {len(ids)} tokens; the KV cache holds {self.scheduler.kv_slots}"
            )
        params = body.sampling_params
        if params.max_new_tokens is not None and params.min_new_tokens > params.max_new_tokens:
            raise EngineRequestError("sampling_params.min_new_tokens must not exceed max_new_tokens")
        if params.stop_strings and self.tokenizer is None:
            raise EngineRequestError("stop strings need a tokenizer; this model directory has none")
        try:
            grammar = params.grammar
        except ValueError as exc:
            raise EngineRequestError(f"sampling_params: {exc}") from None
        if grammar is not None and self.grammars is None:
            raise EngineRequestError(
                f"sampling_params.{grammar[0]} needs a tokenizer; this model directory has none"
            )
        if 0 <= body.logprob_start_len < len(ids):
            raise EngineRequestError("input token logprobs are not supported: leave logprob_start_len at -1")
        rid = body.rid or uuid.uuid4().hex
        if rid in self._inflight:
            raise EngineRequestError(f"a request with rid {rid!r} is already running")
        return Request(
            rid=rid,
            ids=ids,
            n_input=len(ids),
            params=params,
            return_logprob=body.return_logprob,
            top_logprobs_num=body.top_logprobs_num if body.return_logprob else 0,
            stream=body.stream,
        )

    async def generate(self, body: GenerateRequest) -> GenerateResponse:
        """Run one request to its end (stop, length or abort)."""
        final = None
        async for chunk in self.generate_stream(body):
            final = chunk
        assert final is not None
        return final

    async def generate_stream(self, body: GenerateRequest) -> AsyncGenerator[GenerateResponse, None]:
        """Yield a cumulative response at every step that brings new tokens, the last one finished."""
        self._bind_loop()
        req = self._prepare(body)
        if (grammar := body.sampling_params.grammar) is not None and self.grammars is not None:
            # compiled on a worker thread (not the loop, not the engine thread); a bad constraint is a 400 here
            req.matcher = await asyncio.to_thread(self.grammars.matcher, *grammar)
        while self._update_done is not None:  # a weight update is waiting for the requests before it
            await self._update_done.wait()
        if self._torn:  # the last update broke off: some weights are its version's, some the one before
            raise EngineRequestError(f"no weights to sample with: {self._torn}; waiting for a whole update",
                                     status=503)  # fmt: skip
        sink = _Sink(req)
        req.sink = sink
        if body.sampling_params.max_new_tokens == 0:
            req.finish = {"type": "length", "length": 0}
            yield self._response(req)
            return
        self._inflight[req.rid] = req
        self._incoming.append(req)
        self._wake.set()
        try:
            while True:
                await sink.event.wait()
                sink.event.clear()
                done = req.finish is not None
                if req.finish and req.finish.get("error"):
                    raise EngineError(req.finish["message"])
                if done or body.stream:
                    yield self._response(req)
                if done:
                    return
        finally:
            self._inflight.pop(req.rid, None)
            if req.finish is None:  # the caller went away: stop generating for it
                self._call(lambda: self._abort_now(req, "client disconnected"))
            if not self._inflight and self._idle is not None:
                self._idle.set()

    def _response(self, req: Request) -> GenerateResponse:
        n = req.n_output  # the engine thread only appends; read a consistent prefix
        out = req.ids[req.n_input : req.n_input + n]
        meta = GenerateMeta(
            id=req.rid,
            finish_reason=req.finish,
            prompt_tokens=req.n_input,
            completion_tokens=n,
            cached_tokens=max(req.cached_tokens, 0),
            weight_version=str(self.weight_version),
            e2e_latency=time.time() - req.created_s,
        )
        if req.return_logprob:
            meta.output_token_logprobs = [(lp, t, None) for lp, t in zip(req.logprobs[:n], out, strict=True)]
            if req.top_logprobs_num:
                meta.output_top_logprobs = [[(lp, t, None) for lp, t in top] for top in req.top_logprobs[:n]]
        return GenerateResponse(text=self._text(req, out), output_ids=out, meta_info=meta)

    def _text(self, req: Request, out: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        p = req.params
        text: str = self.tokenizer.decode(out, skip_special_tokens=p.skip_special_tokens)
        matched = (req.finish or {}).get("matched")
        if isinstance(matched, str) and not p.no_stop_trim:
            cut = text.find(matched)
            if cut >= 0:
                text = text[:cut]
        return text

    def _decode(self, ids: list[int]) -> str:
        assert self.tokenizer is not None
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def _abort_now(self, req: Request, message: str) -> None:
        if req.finish is None:
            self.scheduler.abort(req, message)
            self._publish([req])

    async def abort(self, rid: str = "", abort_all: bool = False) -> int:
        """Abort one request (by rid) or all; aborted requests return what they generated. Returns how many."""
        if not abort_all and rid not in self._inflight:
            raise EngineRequestError(f"no running request has rid {rid!r}", status=404)

        def run() -> int:
            while self._incoming:
                self.scheduler.add(self._incoming.popleft())
            targets = list(self.scheduler.running) + list(self.scheduler.waiting)
            if not abort_all:
                targets = [r for r in targets if r.rid == rid]
            for req in targets:
                self._abort_now(req, "aborted by request")
            return len(targets)

        return await self._call(run)

    # ---- control ----------------------------------------------------------------------------------------------
    async def pause(self, mode: str = "abort") -> None:
        """Stop stepping. ``abort``: end in-flight requests; ``retract``: requeue them; ``in_place``: freeze."""

        def run() -> None:
            sched = self.scheduler
            sched.paused = True
            if mode == "abort":
                for req in list(sched.running) + list(sched.waiting):
                    self._abort_now(req, "aborted by pause_generation")
            elif mode == "retract":
                for req in reversed(list(sched.running)):
                    sched.retract(req)

        await self._call(run)

    async def continue_generation(self) -> None:
        """Resume stepping after ``pause``."""

        def run() -> None:
            self.scheduler.paused = False

        await self._call(run)

    async def flush_cache(self) -> int:
        """Drop every prefix-cache entry no running request uses; returns freed tokens."""
        return await self._call(self.scheduler.cache.flush)

    async def release_memory(self, tags: list[str] | None = None) -> None:
        """Free the weights and/or the KV cache (``tags``: weights, kv_cache; None: both)."""
        chosen = _tags(tags)

        def run() -> None:
            if self.scheduler.running:
                raise EngineRequestError(
                    f"{len(self.scheduler.running)} requests are running; pause_generation (mode abort or retract) first"
                )
            if "kv_cache" in chosen and self.scheduler.kv_allocated:
                self.scheduler.release_kv()
            if "weights" in chosen and self.model.loaded:
                self.model.release()
            self._released |= chosen
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

        await self._call(run)

    async def resume_memory(self, tags: list[str] | None = None) -> None:
        """Rebuild what ``release_memory`` freed; weights come back from the last checkpoint on disk."""
        chosen = _tags(tags)

        def run() -> None:
            if "kv_cache" in chosen and not self.scheduler.kv_allocated:
                self.scheduler.allocate_kv()
            if "weights" in chosen and not self.model.loaded:
                path, version = self._weights_source
                self.model.load_dir(path)
                self.weight_version, self._torn = version, ""
            self._released -= chosen

        await self._call(run)

    async def update_weights_from_disk(self, body: UpdateWeightsFromDiskRequest) -> int:
        """Load new weights from a Hugging Face directory of the same architecture; returns the new version."""
        version = self._requested_version(body.weight_version, "update_weights_from_disk")
        spec = ModelSpec.from_dir(body.model_path)
        if (spec.num_layers, spec.hidden_size, spec.vocab_size) != (
            self.spec.num_layers,
            self.spec.hidden_size,
            self.spec.vocab_size,
        ):
            raise EngineRequestError(f"{body.model_path} has a different architecture than the served model")

        def run() -> int:
            self.model.load_dir(body.model_path)
            self.scheduler.cache.invalidate()
            self.weight_version, self._torn = version, ""
            self._weights_source = (body.model_path, self.weight_version)
            return self.weight_version

        async with self._weights_exclusive(body.abort_all_requests):
            return await self._call(run)

    @contextlib.asynccontextmanager
    async def _weights_exclusive(self, abort_all: bool) -> AsyncIterator[None]:
        """SGLang's semantics for a weight update: it waits until the requests in flight have finished
        (``abort_all_requests`` ends them first) while new requests wait for it, so no request's tokens span two
        weight versions and every response's ``weight_version`` is that of all its tokens. Requests the caller
        paused (``in_place``, ``retract``) are not waited for: they continue under the new weights."""
        done = await self._hold(abort_all)
        try:
            yield
        finally:
            self._unhold(done)

    async def _hold(self, abort_all: bool) -> asyncio.Event:
        """Begin a weight update (see `_weights_exclusive`); the event it returns is set by `_unhold`. A push in
        buckets holds from its first call to its last."""
        while self._update_done is not None:
            await self._update_done.wait()
        done = self._update_done = asyncio.Event()
        try:
            if abort_all:
                await self.abort(abort_all=True)
            while self._inflight and not self.scheduler.paused:
                idle = self._idle = asyncio.Event()
                await idle.wait()
        except BaseException:
            self._unhold(done)
            raise
        return done

    def _unhold(self, done: asyncio.Event) -> None:
        if self._update_done is done:
            self._update_done = self._idle = None
        done.set()

    def _abandon(self, push: _Push, why: str) -> None:
        """A push in buckets that will not finish: the weights stay torn (requests are refused) until a whole
        update arrives, and requests stop waiting for it."""
        if self._push is push:
            self._push = None
            push.cancel_timer()
            self._torn = why
            self._unhold(push.done)

    async def init_weights_update_group(self, body: InitWeightsUpdateGroupRequest) -> None:
        """Join the trainer's weight-transfer group as rank ``rank_offset`` (blocks until all ranks joined)."""
        if body.group_name in self._groups:
            raise EngineRequestError(f"weight update group {body.group_name!r} already exists", status=409)
        group = await asyncio.to_thread(
            weight_sync.create_group,
            body.master_address,
            body.master_port,
            body.rank_offset,
            body.world_size,
            body.group_name,
            body.backend,
        )
        self._groups[body.group_name] = group

    async def update_weights_from_distributed(self, body: UpdateWeightsFromDistributedRequest) -> int:
        """Receive the named tensors broadcast by rank 0 of the group, in order; returns the version served.

        A push in buckets is several such calls, each saying how many follow (``buckets_left``): requests wait from
        the first to the last, and the version changes only with the last. A push whose next call does not come
        within the group's timeout (the trainer died), or whose call fails, leaves the engine refusing requests
        (torn weights) until a whole update arrives: it never serves a mix as the new version.
        """
        push = self._push if self._push is not None and self._push.group_name == body.group_name else None
        if push is not None:  # the next bucket of the push under way: it holds requests already
            push.cancel_timer()
            self._push = None
        try:
            version, group, dtypes = self._check_update(body)
            done = push.done if push is not None else await self._hold(body.abort_all_requests)
        except BaseException:
            if push is not None:
                self._push = push
                self._abandon(push, "a push in buckets broke off: one of its calls was refused")
            raise
        left = body.buckets_left
        broke_off = f"a push in buckets broke off with {left} of its buckets unsent"

        def run() -> int:
            if not self.model.loaded:
                raise EngineRequestError("weights are released; resume_memory_occupation first")
            device = self.device if self.device.type == "cuda" else "cpu"
            torn = f"the update to version {version} broke off mid-transfer" if not left else broke_off
            if body.load_format == "flattened_bucket":  # one buffer: the tensors' bytes back to back
                size = sum(math.prod(shape) * torch.empty(0, dtype=d).element_size()
                           for d, shape in zip(dtypes, body.shapes, strict=True))  # fmt: skip
                same = set(dtypes) == {self.model.dtype}
                direct = self.model.receive_buffer(body.names, self.model.dtype) if same else None
                if direct is not None and direct.numel() == size:  # the bucket is our own layout: in place
                    self._torn = torn  # until it ends
                    group.broadcast(direct)
                else:  # one receive buffer per group, as large as the largest bucket: a bucket, not a model
                    flat = self._bucket.get(body.group_name)
                    if flat is None or flat.numel() < size:  # kept: fresh pages cost as much as the transfer
                        self._bucket.pop(body.group_name, None)
                        flat = self._bucket[body.group_name] = torch.empty(
                            size, dtype=torch.uint8, device=device
                        )
                    group.broadcast(flat[:size])
                    received = weight_sync.split_bytes(flat[:size], dtypes, body.shapes)
                    self._torn = torn
                    for name, tensor in zip(body.names, received, strict=True):
                        self.model.update_tensor(name, tensor)
            else:
                for name, dtype, shape in zip(body.names, dtypes, body.shapes, strict=True):
                    buf = torch.empty(shape, dtype=dtype, device=device)
                    group.broadcast(buf)
                    self._torn = torn
                    self.model.update_tensor(name, buf)
            if body.flush_cache:
                self.scheduler.cache.invalidate()
            if left:  # part of the push is in: torn until the last bucket (requests wait meanwhile)
                self._torn = broke_off
                return self.weight_version
            self.weight_version, self._torn = version, ""
            return self.weight_version

        try:
            served = await self._call(run)
        except BaseException:
            self._unhold(done)
            raise
        if left:  # wait for the next call, as long as one collective may take
            holder = _Push(body.group_name, done)
            holder.timer = asyncio.get_running_loop().call_later(
                group.timeout_s, self._abandon, holder, f"{broke_off} (none came in {group.timeout_s:g} s)"
            )
            self._push = holder
        else:
            self._unhold(done)
        return served

    def _check_update(
        self, body: UpdateWeightsFromDistributedRequest
    ) -> tuple[int, weight_sync.WeightGroup, list[torch.dtype]]:
        """The version, group and dtypes an update asks for; EngineRequestError (a 400) for what does not fit."""
        version = self._requested_version(body.weight_version, "update_weights_from_distributed")
        group = self._groups.get(body.group_name)
        if group is None:
            raise EngineRequestError(
                f"no weight update group {body.group_name!r}; call init_weights_update_group"
            )
        if not (len(body.names) == len(body.dtypes) == len(body.shapes)):
            raise EngineRequestError("names, dtypes and shapes must have the same length")
        known = self.model.param_shapes()
        for name, shape in zip(body.names, body.shapes, strict=True):
            if known.get(name) != tuple(shape):
                raise EngineRequestError(
                    f"weight {name!r} with shape {shape} does not match the served model"
                )
        return version, group, [weight_sync.parse_dtype(d) for d in body.dtypes]

    def _requested_version(self, requested: str | None, endpoint: str) -> int:
        """The version an update request asks for (None: the current one); a 400 naming the field otherwise."""
        if requested is None:
            return self.weight_version
        try:
            return parse_weight_version(requested, f"{endpoint} request: weight_version")
        except ProtocolError as exc:
            raise EngineRequestError(str(exc)) from None

    # ---- KV hand-over (Gyre extension) -------------------------------------------------------------------------
    async def export_kv(self, input_ids: list[int]) -> bytes:
        """The KV of the longest cached prefix of ``input_ids``, as safetensors bytes (may cover 0 tokens)."""
        from safetensors.torch import save

        def run() -> bytes:
            slots, _ = self.scheduler.cache.match(input_ids)
            n = slots.shape[0]
            k = self.scheduler.k_pool[:, slots].cpu()
            v = self.scheduler.v_pool[:, slots].cpu()
            meta = {"weight_version": str(self.weight_version), "layout": json.dumps(self._kv_layout())}
            return bytes(
                save({"k": k, "v": v, "input_ids": torch.tensor(input_ids[:n], dtype=torch.int64)}, meta)
            )

        return await self._call(run)

    async def import_kv(self, data: bytes) -> int:
        """Insert KV exported by another engine serving the same weights; returns the tokens now cached."""
        from safetensors.torch import load

        try:
            tensors = load(data)
            meta = _safetensors_metadata(data)
            layout, version = json.loads(meta["layout"]), meta["weight_version"]
        except Exception as exc:
            raise EngineRequestError(f"the body is not a KV export: {exc}") from None
        if layout != self._kv_layout():
            raise EngineRequestError(f"KV layout {layout} does not match this engine's {self._kv_layout()}")
        if version != str(self.weight_version):
            raise EngineRequestError(
                f"KV was computed with weight version {version}; this engine serves {self.weight_version}",
                status=409,
            )
        ids = tensors["input_ids"].tolist()

        def run() -> int:
            sched = self.scheduler
            slots = sched._alloc(len(ids))
            if slots is None:
                raise EngineCapacityError(f"no room for {len(ids)} KV slots", status=507)
            sched.k_pool[:, slots] = tensors["k"].to(sched.k_pool)
            sched.v_pool[:, slots] = tensors["v"].to(sched.v_pool)
            keep = sched.cache.insert(ids, slots)
            sched.pool.free(slots[:keep])
            return len(ids)

        return await self._call(run)

    def _kv_layout(self) -> dict[str, Any]:
        s = self.spec
        return {
            "layers": s.num_layers,
            "kv_heads": s.num_kv_heads,
            "head_dim": s.head_dim,
            "dtype": str(self.dtype),
        }

    # ---- introspection ------------------------------------------------------------------------------------------
    def model_info(self) -> dict[str, Any]:
        """SGLang's ``/get_model_info`` body."""
        return {
            "model_path": self.cfg.model_path,
            "tokenizer_path": self.cfg.model_path,
            "is_generation": True,
            "weight_version": str(self.weight_version),
            "architecture": self.spec.architecture,
            "context_length": self.context_length,
            "vocab_size": self.spec.vocab_size,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
        }

    def statistics(self) -> EngineStatistics:
        """Current load and counters (read without stopping the engine thread)."""
        sched, st = self.scheduler, self.scheduler.stats
        return EngineStatistics(
            running_requests=len(sched.running),
            waiting_requests=len(sched.waiting) + len(self._incoming),
            kv_slots_total=sched.kv_slots,
            kv_slots_free=sched.pool.available if sched.kv_allocated else 0,
            cached_tokens=sched.cache.cached_tokens if sched.kv_allocated else 0,
            steps=st.steps,
            generated_tokens=st.generated_tokens,
            prefill_tokens=st.prefill_tokens,
            cached_prompt_tokens=st.cached_prompt_tokens,
            retracted_requests=st.retracted,
            paused=sched.paused,
            released=sorted(self._released),
            weight_version=self.weight_version,
            receive_buffer_bytes_max=max((b.numel() for b in self._bucket.values()), default=0),
        )

    def close(self) -> None:
        """Stop the engine thread (in-flight requests are abandoned)."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=10)


def _wake_sinks(news: list[Request]) -> None:
    for req in news:
        if isinstance(req.sink, _Sink):
            req.sink.event.set()


def _tags(tags: list[str] | None) -> set[str]:
    known = {"weights", "kv_cache"}
    chosen = set(tags) if tags else set(known)
    return chosen & known  # cuda_graph is accepted for SGLang compatibility and means nothing here


def _load_tokenizer(model_dir: str) -> Any:
    if (
        not (Path(model_dir) / "tokenizer.json").exists()
        and not (Path(model_dir) / "tokenizer_config.json").exists()
    ):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


def _safetensors_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors blob held in memory."""
    n = int.from_bytes(data[:8], "little")
    meta: dict[str, str] = json.loads(data[8 : 8 + n]).get("__metadata__", {})
    return meta

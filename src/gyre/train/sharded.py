"""The core cell's training state sharded over its ranks (ZeRO-1): each rank owns one contiguous range of the flat
parameter space and holds only that range's fp32 master weights, float64 gradient sum and AdamW moments.

The flat space is ``state.flatten_parameters``' layout (parameters in ``named_parameters`` order, each flattened), cut
into ``world`` ranges of ``ceil(numel / world)`` values (``shard_bounds``; a parameter may straddle two ranks, the
last range may be short). Every rank keeps a whole model replica to compute micro-steps on (fp32 on CPU, bf16 on a
GPU); its ``.grad`` is what a micro-step leaves, and what reaches a shard is summed in float64 as in ``TrainState``, so
the update does not depend on which rank computed which micro-step or in what order.

A step, on every rank of the group (all collective calls, in the same order):
- ``accumulate(gradient)`` per micro-step into a local float64 sum of the whole model (no communication), then
  ``reduce()`` once: the local sums go to the owners bucket by bucket. This is what the core cell does: one
  reduction a step however many micro-steps each rank computed;
- or ``reduce_scatter(gradient)`` per micro-step round (``None`` where a rank has none): no local sum at all, a
  reduction a round (what the cell did before; kept for a replica too large to keep a float64 sum beside);
- ``add_owned(start, values)`` adds a piece of this rank's range that came from elsewhere (a satellite, rank to rank);
- ``apply(lr)``: the global gradient norm (one all-reduce of a scalar), the same clipping as ``TrainState.apply``,
  AdamW on the shard, then the updated weights are all-gathered into every replica bucket by bucket.

Buckets: one reduction moves ``bucket_mib`` of float64 gradient (``world`` slices of ``bucket_numel`` values, one per
owner) through a staging buffer of that size; weights come back in the same slices, in the replica's dtype. Neither
the gradient sum nor the optimizer state of the whole model is ever held by one rank (the local sum of ``accumulate``
is this rank's own micro-steps, not the cell's).

The reduction is a ring (``ring_reduce_scatter``) where the group is gloo: N-1 steps, in each every rank sends one
owner's slice, summed so far, to the next rank and adds the one it receives, so each rank writes (N-1)/N of the
bucket; gloo's own reduce-scatter writes 2(N-1)/N (measured on the sockets: it moves what an all-reduce does). On
NCCL the library's reduce-scatter is that ring already. Every owner's sum is added in float64 in a fixed order (ring
order from the next rank round to itself), so the result does not depend on timing. The invariant kept: the update
is one process's (``TrainState``) bit for bit where the float64 sums of the same fp32 gradients in another grouping
round to the same fp32 values (float64 carries 29 more bits than the fp32 it is rounded to once, in ``apply``): every
test finds it so without clipping (weights and moments compared with ``torch.equal`` after steps of 1 to 8
micro-steps a rank, 2 and 4 ranks). With clipping the global norm is a float64 sum over ranks where one process
takes torch's fp32 norms per parameter, so the clip factor may round an ulp apart: every gradient then within
1e-7 relative, the update within 1e-6. Weights are all-gathered by the library
(gloo's all-gather already writes (N-1)/N). Both report what crossed this rank's sockets (``gyre.train.wire``).

Why not the libraries (torch 2.13, gloo, measured): ``ZeroRedundancyOptimizer`` runs, but steps on each owned
parameter's ``.grad`` in the parameter's dtype (no float64 sum to keep), partitions whole parameters (1/N only as well
as a greedy packing allows; a 151936 x 4096 embedding is 7.6% of Qwen3-8B) and checkpoints by consolidating the whole
optimizer state on one rank. FSDP2 (``fully_shard``) runs, but with ``reduce_dtype=float64`` it casts each
reduce-scattered gradient back to fp32 into the sharded ``.grad`` (sums across reduces are fp32 again), and gradients
enter it only through its autograd hooks, so a satellite's gradient from the wire has no way in.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import msgspec
import torch
import torch.distributed as dist

from gyre.config import TrainerConfig
from gyre.train.state import flatten_parameters, parameters
from gyre.train.wire import tcp_bytes_sent

_F64 = torch.float64


def shard_bounds(numel: int, world: int) -> list[tuple[int, int]]:
    """Each rank's ``[start, end)`` of a flat space of ``numel`` values: contiguous, in rank order, covering it."""
    size = -(-numel // world)
    return [(min(r * size, numel), min((r + 1) * size, numel)) for r in range(world)]


class ShardStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """One rank's share of the state, in bytes measured from its tensors, and what its collectives moved."""

    rank: int
    world: int
    start: int  # this rank's range of the flat parameter space, [start, end)
    end: int
    master_bytes: int  # fp32 master weights of the range
    gradient_bytes: int  # float64 gradient sum of the range
    optimizer_bytes: int  # AdamW moments and step count of the range
    local_bytes: int  # the local float64 sum of the whole model, while one is held (accumulate -> reduce)
    reduced_bytes: int  # gradient bytes this rank put into reduce-scatters, all steps
    gathered_bytes: int  # weight bytes this rank received in all-gathers, all steps
    owned_bytes: int = 0  # gradient bytes added to its range from elsewhere (satellites' sums), all steps
    reductions: int = 0  # gradient reductions over the group, all steps (one a step in the core cell)
    reduce_wire_bytes: int = 0  # bytes this rank's TCP sockets sent during its reductions, all steps
    gather_wire_bytes: int = 0  # bytes its TCP sockets sent during its weight gathers, all steps


class ShardedState:
    """One rank's shard of the core cell's training state, and its model replica (see the module). One thread per
    rank calls it; the collective methods are called on every rank of ``group`` in the same order."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: TrainerConfig,
        group: dist.ProcessGroup | None = None,
        bucket_mib: float | None = None,
    ) -> None:
        self.cfg, self.group, self.model = cfg, group, model
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        # the replica's weights, one buffer (its parameters become views of it, so a gather updates the model)
        self.flat = flatten_parameters(model)
        self.named = parameters(model)
        self.numel = self.flat.numel()
        self.start, self.end = shard_bounds(self.numel, self.world)[self.rank]
        # every rank's shard has this length (the same for every collective); past ``end`` it holds zeros
        self.shard_numel = -(-self.numel // self.world)
        device = self.flat.device
        # per owner per collective: a reduce-scatter's staging buffer holds bucket_mib of float64
        mib = cfg.bucket_mib if bucket_mib is None else bucket_mib
        self.bucket_numel = max(1, min(self.shard_numel, int(mib * 2**20) // (8 * self.world)))
        master = torch.zeros(self.shard_numel, dtype=torch.float32, device=device)
        master[: self.end - self.start].copy_(self.flat[self.start : self.end])
        self.master = torch.nn.Parameter(master)  # the authoritative weights of the range
        self.gradient_sum = torch.zeros(self.shard_numel, dtype=_F64, device=device)
        self.optimizer = torch.optim.AdamW(
            [self.master],
            lr=cfg.learning_rate,
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
            foreach=False,
        )  # TrainState's hyperparameters and single-tensor kernel: elementwise, so a flat shard steps bit for bit
        # as the parameters it covers do one by one (the step count is one for all, as every parameter steps)
        self._local: torch.Tensor | None = None
        # held while the sum changes: a rank's reduce-scatters and the pieces satellites send may run on two threads
        self.sum_lock = threading.Lock()
        self._owned_bytes = 0
        self._reduced_bytes = 0
        self._gathered_bytes = 0
        self._reductions = 0
        self._reduce_wire = 0
        self._gather_wire = 0
        self._ring = dist.get_backend(group) == "gloo"

    # ---- gradients ------------------------------------------------------------------------------------------
    def accumulate(self, gradient: torch.Tensor) -> None:
        """Add one micro-step's flat gradient to this rank's local sum (no communication), float64 unless
        ``trainer.gradient_accumulation = "float32"``."""
        self._check(gradient)
        if self._local is None:
            dtype = torch.float32 if self.cfg.accumulation == "float32" else _F64
            self._local = torch.zeros(self.numel, dtype=dtype, device=self.flat.device)
        self._local.add_(gradient)  # computed in the sum's dtype, no copy of the gradient

    def reduce(self) -> None:
        """(collective) Every rank's local sum into the owners' shards, bucket by bucket; the local sum is freed."""
        local, self._local = self._local, None
        self._reduce_scatter(local)

    def reduce_scatter(self, gradient: torch.Tensor | None) -> None:
        """(collective) One micro-step's flat gradient straight into the owners' shards (``None``: this rank has
        none this round and sends zeros)."""
        if gradient is not None:
            self._check(gradient)
        self._reduce_scatter(gradient)

    def add_owned(self, start: int, values: torch.Tensor) -> None:
        """Add ``values`` for flat positions ``start, start + 1, ...``, all inside this rank's range (a piece a
        satellite sent to its owner)."""
        if not self.start <= start <= start + values.numel() <= self.end:
            raise ValueError(
                f"positions [{start}, {start + values.numel()}) are not in rank {self.rank}'s range "
                f"[{self.start}, {self.end})"
            )
        lo = start - self.start
        with self.sum_lock:
            self.gradient_sum[lo : lo + values.numel()].add_(values.reshape(-1))
            self._owned_bytes += values.numel() * values.element_size()

    def _check(self, gradient: torch.Tensor) -> None:
        if gradient.numel() != self.numel:
            raise ValueError(f"a gradient of {gradient.numel()} values for a model of {self.numel}")

    def _buckets(self) -> Iterator[tuple[int, int]]:
        """``[lo, hi)`` within every shard, one collective each."""
        for lo in range(0, self.shard_numel, self.bucket_numel):
            yield lo, min(lo + self.bucket_numel, self.shard_numel)

    def _pieces(self, lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
        """For bucket ``[lo, hi)``: (owner, flat start, values) of each owner's slice that lies inside the model."""
        for r in range(self.world):
            at = r * self.shard_numel + lo
            yield r, at, max(0, min(hi - lo, self.numel - at))

    def _reduce_scatter(self, source: torch.Tensor | None) -> None:
        device = self.flat.device
        stage = torch.empty(self.world * self.bucket_numel, dtype=_F64, device=device)  # bucket_mib
        received = torch.empty(self.bucket_numel, dtype=_F64, device=device)
        wire = tcp_bytes_sent()
        for lo, hi in self._buckets():
            n = hi - lo
            rows = stage[: self.world * n].view(self.world, n)
            if source is None:
                rows.zero_()
            else:
                for r, at, k in self._pieces(lo, hi):
                    rows[r, :k].copy_(source[at : at + k])
                    rows[r, k:].zero_()
            if self._ring:
                ring_reduce_scatter(rows, received[:n], self.group)
            else:
                dist.reduce_scatter_single(received[:n], rows.reshape(-1), group=self.group)
            with self.sum_lock:
                self.gradient_sum[lo:hi].add_(received[:n])
            self._reduced_bytes += rows.numel() * rows.element_size()
        self._reductions += 1
        self._reduce_wire += tcp_bytes_sent() - wire

    # ---- the update -------------------------------------------------------------------------------------------
    def apply(self, lr: float) -> float:
        """(collective) One AdamW update of every shard from the gradient sums, then every replica gets the new
        weights; clears the sums. ``lr``: the step's learning rate (``TrainState.lr_at``). Returns the gradient norm
        (before clipping), as ``TrainState.apply`` does."""
        grad = self.gradient_sum.to(torch.float32)  # as TrainState: the float64 sum, rounded once
        squares = torch.linalg.vector_norm(grad, dtype=_F64).square().reshape(1)
        dist.all_reduce(squares, group=self.group)
        total = squares.sqrt().to(torch.float32)[0]
        if self.cfg.grad_clip_norm > 0:  # torch.nn.utils.clip_grad_norm_'s arithmetic, on the global norm
            grad.mul_(torch.clamp(self.cfg.grad_clip_norm / (total + 1e-6), max=1.0))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.master.grad = grad
        self.optimizer.step()
        self.master.grad = None
        self.gradient_sum.zero_()
        self.gather_weights()
        return float(total)

    def gather_weights(self) -> None:
        """(collective) Every rank's master weights into every replica, bucket by bucket, in the replica's dtype."""
        dtype, device = self.flat.dtype, self.flat.device
        mine = torch.empty(self.bucket_numel, dtype=dtype, device=device)
        stage = torch.empty(self.world * self.bucket_numel, dtype=dtype, device=device)
        wire = tcp_bytes_sent()
        with torch.no_grad():
            for lo, hi in self._buckets():
                n = hi - lo
                mine[:n].copy_(self.master[lo:hi])
                rows = stage[: self.world * n]
                dist.all_gather_single(rows, mine[:n], group=self.group)
                for r, at, k in self._pieces(lo, hi):
                    self.flat[at : at + k].copy_(rows[r * n : r * n + k])
                self._gathered_bytes += rows.numel() * rows.element_size()
        self._gather_wire += tcp_bytes_sent() - wire

    # ---- checkpoints ------------------------------------------------------------------------------------------
    def flat_state(self) -> dict[str, torch.Tensor]:
        """This rank's range in the flat layout of sharded checkpoints (``gyre.train.checkpoint``): fp32 ``master``
        weights and, once an update has run, ``exp_avg``, ``exp_avg_sq`` and the 0-d ``step``."""
        n = self.end - self.start
        out = {"master": self.master.detach()[:n]}
        moments = self.optimizer.state.get(self.master)
        if moments:
            out.update(exp_avg=moments["exp_avg"][:n], exp_avg_sq=moments["exp_avg_sq"][:n])
            out["step"] = moments["step"].detach().clone()
        return out

    def load_flat_state(self, flat: dict[str, torch.Tensor], weights: bool) -> None:
        """(collective with ``weights``) This rank's range of a checkpoint's flat state (``checkpoint.load_flat_state``
        over this group): the AdamW moments and, with ``weights``, the master weights, then gathered into every
        replica."""
        n = self.end - self.start
        if "exp_avg" in flat:
            state: dict[str, torch.Tensor] = {"step": flat["step"].detach().clone()}
            for key in ("exp_avg", "exp_avg_sq"):
                state[key] = torch.zeros_like(self.master, memory_format=torch.contiguous_format)
                state[key][:n].copy_(flat[key])
            self.optimizer.state[self.master] = state
        if weights and "master" in flat:
            with torch.no_grad():
                self.master[:n].copy_(flat["master"])
            self.gather_weights()

    def statistics(self) -> ShardStatistics:
        """This rank's bytes of state, measured from its tensors."""

        def size(t: torch.Tensor) -> int:
            return t.numel() * t.element_size()

        moments = self.optimizer.state.get(self.master, {})
        return ShardStatistics(
            rank=self.rank, world=self.world, start=self.start, end=self.end, master_bytes=size(self.master),
            gradient_bytes=size(self.gradient_sum),
            optimizer_bytes=sum(size(v) for v in moments.values() if isinstance(v, torch.Tensor)),
            local_bytes=0 if self._local is None else size(self._local),
            reduced_bytes=self._reduced_bytes, gathered_bytes=self._gathered_bytes, owned_bytes=self._owned_bytes,
            reductions=self._reductions, reduce_wire_bytes=self._reduce_wire, gather_wire_bytes=self._gather_wire,
        )  # fmt: skip


def ring_reduce_scatter(
    rows: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None
) -> None:
    """(collective) ``out`` = the sum over the group's ranks of their ``rows[rank]`` (``rows``: ``[world, n]``, row r
    for rank r; it is overwritten), as a ring: in step s = 0..N-2 rank r sends row ``(r - s - 1) mod N``, summed so
    far, to rank r+1 and adds row ``(r - s - 2) mod N`` from rank r-1 into its own, so each rank sends (N-1) rows.
    Row r is summed in the order r+1, r+2, ..., r (float64 in, the same order every time)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world == 1:
        out.copy_(rows[0])
        return
    after, before = (rank + 1) % world, (rank - 1) % world
    if group is not None:
        after, before = dist.get_global_rank(group, after), dist.get_global_rank(group, before)
    incoming = torch.empty_like(rows[0])
    for s in range(world - 1):
        send, receive = (rank - s - 1) % world, (rank - s - 2) % world
        sent = dist.isend(rows[send], dst=after, group=group)
        dist.recv(incoming, src=before, group=group)
        if sent is not None:  # (None only on a rank outside the group)
            sent.wait()
        rows[receive].add_(incoming)
    out.copy_(rows[rank])

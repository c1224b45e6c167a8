"""The engine's step loop state: admission, chunked prefill, batched decode, sampling, finishing.

Everything here is owned by the engine thread: no locks, no awaits. Between steps the thread runs queued commands
(abort, pause, weight updates), so a command never observes half a step.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gyre.engine.embedded.cache import DecodeLanes, RadixCache, SlotPool, _Node
from gyre.engine.embedded.grammar import Grammars
from gyre.engine.embedded.transformer import ForwardBatch, TransformerLM
from gyre.protocol import SamplingParams

_STOP_WINDOW_PER_CHAR = 4  # tokens looked back per stop-string character (byte-level vocabularies: <= 4)


@dataclass(eq=False)
class Request:
    """One generation request as the engine thread sees it. ``ids`` is input followed by output."""

    rid: str
    ids: list[int]
    n_input: int
    params: SamplingParams
    return_logprob: bool
    top_logprobs_num: int = 0
    stream: bool = False
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    row: int = -1  # row of the request-to-slot table while admitted
    computed: int = 0  # leading tokens of ``ids`` whose KV is in the pool
    cached: int = 0  # leading tokens whose slots belong to the prefix cache (locked via ``node``)
    node: _Node | None = None
    cached_tokens: int = -1  # prefix-cache hit at first admission, reported to the client
    generation: int = 0  # cache generation (weights) the KV was computed under
    created_s: float = field(default_factory=time.time)
    first_token_s: float | None = None
    generator: torch.Generator | None = None
    stop_ids: frozenset[int] = frozenset()
    sink: Any = None  # the asyncio-side handle; the scheduler only passes it through
    matcher: Any = None  # xgrammar.GrammarMatcher of a constrained request; it has accepted the output ids

    @property
    def output_ids(self) -> list[int]:
        """Tokens sampled so far."""
        return self.ids[self.n_input :]

    @property
    def n_output(self) -> int:
        """Number of tokens sampled so far."""
        return len(self.ids) - self.n_input


@dataclass
class StepStats:
    """Counters the engine reports."""

    steps: int = 0
    generated_tokens: int = 0
    prefill_tokens: int = 0
    cached_prompt_tokens: int = 0
    retracted: int = 0
    lane_decodes: int = 0  # decode rows that attended over their lane
    gathered_decodes: int = 0  # decode rows that gathered their KV from the pool


class Scheduler:
    """Continuous batching over a token-granular KV pool with a radix prefix cache."""

    def __init__(
        self,
        model: TransformerLM,
        kv_slots: int,
        max_running: int,
        max_prefill_tokens: int,
        context_length: int,
        enable_prefix_cache: bool,
        seed: int,
        decode_text: Callable[[list[int]], str] | None,
        lane_positions: int = 0,
    ) -> None:
        self.model = model
        self.kv_slots = kv_slots
        self.lane_positions = lane_positions  # token positions of `DecodeLanes` (0: every decode gathers)
        self.max_running = max_running
        self.max_prefill_tokens = max_prefill_tokens
        self.context_length = context_length
        self.enable_prefix_cache = enable_prefix_cache
        self.decode_text = decode_text
        self.eos_ids = frozenset(model.spec.eos_token_ids)
        self.grammars: Grammars | None = None  # set by the engine; masks the rows of constrained requests
        self.generator = torch.Generator(device=model.device).manual_seed(seed)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.paused = False
        self.stats = StepStats()
        self.kv_allocated = False
        self.allocate_kv()

    # ---- memory ---------------------------------------------------------------------------------------------
    def allocate_kv(self) -> None:
        """Create the KV pools, the slot table and an empty prefix cache."""
        s, dev = self.model.spec, self.model.device
        shape = (s.num_layers, self.kv_slots, s.num_kv_heads * s.head_dim)
        self.k_pool = torch.zeros(shape, dtype=self.model.dtype, device=dev)
        self.v_pool = torch.zeros(shape, dtype=self.model.dtype, device=dev)
        self.req_to_token = torch.zeros(self.max_running, self.context_length, dtype=torch.int32, device=dev)
        self.free_rows = list(range(self.max_running - 1, -1, -1))
        self.pool = SlotPool(self.kv_slots, dev)
        self.cache = RadixCache(self.pool, enabled=self.enable_prefix_cache)
        self.lanes = self._new_lanes()
        self.kv_allocated = True

    def _new_lanes(self) -> DecodeLanes:
        s, dev, dtype = self.model.spec, self.model.device, self.model.dtype
        return DecodeLanes(
            s.num_layers, s.num_kv_heads, s.head_dim, self.lane_positions, self.max_running, dev, dtype
        )

    def release_kv(self) -> None:
        """Drop the KV pools and the prefix cache (only when no request is admitted)."""
        assert not self.running
        empty = torch.empty(0)
        self.k_pool = self.v_pool = self.req_to_token = empty
        self.lanes = self._new_lanes()  # storage is allocated on first use
        self.kv_allocated = False

    def _alloc(self, n: int) -> torch.Tensor | None:
        slots = self.pool.alloc(n)
        if slots is None and self.cache.evictable_tokens:
            self.cache.evict(n - self.pool.available)
            slots = self.pool.alloc(n)
        return slots

    # ---- request lifecycle ----------------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        """Queue a request; it joins the running batch at the next step with room."""
        req.stop_ids = frozenset(req.params.stop_token_ids or ())
        if req.params.sampling_seed is not None:
            req.generator = torch.Generator(device=self.model.device).manual_seed(req.params.sampling_seed)
        self.waiting.append(req)

    def has_work(self) -> bool:
        """Whether a step would do anything."""
        return (
            not self.paused and self.kv_allocated and self.model.loaded and bool(self.running or self.waiting)
        )

    def find(self, rid: str) -> Request | None:
        """The in-flight request with this id."""
        for req in self.running:
            if req.rid == rid:
                return req
        for req in self.waiting:
            if req.rid == rid:
                return req
        return None

    def abort(self, req: Request, message: str) -> None:
        """End a request now; its computed KV stays in the prefix cache (so it can be exported or resumed)."""
        if req in self.running:
            self.running.remove(req)
            self._release(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.finish = {"type": "abort", "message": message}

    def retract(self, req: Request) -> None:
        """Give back a running request's KV (kept in the cache where possible) and requeue it first."""
        self.running.remove(req)
        self._release(req)
        self.waiting.appendleft(req)
        self.stats.retracted += 1

    def _admit(self, req: Request) -> None:
        """Give a waiting request a table row and its cached prefix."""
        slots, node = self.cache.match(req.ids[:-1])  # at least one token is computed: it yields the logits
        self.cache.lock(node)
        n = slots.shape[0]
        req.row = self.free_rows.pop()
        self.req_to_token[req.row, :n] = slots
        req.node, req.cached, req.computed, req.generation = node, n, n, self.cache.generation
        if req.cached_tokens < 0:
            req.cached_tokens = n
            self.stats.cached_prompt_tokens += n

    def _release(self, req: Request) -> None:
        """Hand a request's KV to the prefix cache (or free it) and give back its row and lane."""
        self.lanes.release(req)
        if req.row < 0:
            return
        slots = self.req_to_token[req.row, : req.computed].long()
        keep = req.computed
        if req.generation == self.cache.generation:
            keep = self.cache.insert(req.ids[: req.computed], slots)
        if keep > req.cached:
            self.pool.free(slots[req.cached : keep])
        if req.node is not None:
            self.cache.unlock(req.node)
        self.free_rows.append(req.row)
        req.row, req.node, req.computed, req.cached = -1, None, 0, 0

    # ---- one step -------------------------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """Run one forward over decode rows and prefill chunks; return requests with news (tokens or finish)."""
        budget = self.max_prefill_tokens
        decodes: list[Request] = []
        chunks: list[tuple[Request, int]] = []
        for req in self.running:
            pending = len(req.ids) - req.computed
            if pending == 1:
                decodes.append(req)
            elif budget > 0:
                take = min(pending, budget)
                chunks.append((req, take))
                budget -= take
        # decode slots first: running requests outrank new ones; under pressure retract the newest
        dec_slots = self._alloc(len(decodes)) if decodes else None
        while decodes and dec_slots is None:
            victim = decodes.pop()
            self.retract(victim)
            dec_slots = self._alloc(len(decodes)) if decodes else None
        chunk_slots: list[torch.Tensor] = []
        for req, take in list(chunks):
            got = self._alloc(take)
            if got is None:
                chunks.remove((req, take))
                continue
            chunk_slots.append(got)
        news: list[Request] = []
        while self.waiting and budget > 0 and self.free_rows:
            req = self.waiting[0]
            self._admit(req)
            take = min(len(req.ids) - req.computed, budget)
            got = self._alloc(take)
            if got is None:
                self._release(req)
                if not self.running and not decodes:  # nothing else holds memory: it can never fit
                    self.waiting.popleft()
                    req.finish = {"type": "abort", "message": "the KV cache is too small for this request"}
                    news.append(req)
                break
            self.waiting.popleft()
            self.running.append(req)
            chunks.append((req, take))
            chunk_slots.append(got)
            budget -= take
        if not decodes and not chunks:
            if self.running:  # memory is full of half-prefilled requests: requeue the newest to let others on
                self.retract(self.running[-1])
            return news
        decodes, num_lane = self._lane_decodes(decodes)
        self.stats.lane_decodes += num_lane
        self.stats.gathered_decodes += len(decodes) - num_lane
        batch = self._build(decodes, num_lane, dec_slots, chunks, chunk_slots)
        logits = self.model.forward(batch, self.k_pool, self.v_pool)
        for req in decodes:
            req.computed += 1
        sampled: list[Request] = list(decodes)
        for req, take in chunks:
            req.computed += take
            self.stats.prefill_tokens += take
            if req.computed == len(req.ids):
                sampled.append(req)
        self._sample(sampled, logits)
        self.stats.steps += 1
        self.stats.generated_tokens += len(sampled)
        now = time.time()
        for req in sampled:
            if req.first_token_s is None:
                req.first_token_s = now
            if req.finish is None:  # sampling may have ended it (a grammar refused its token)
                self._check_finish(req)
            if req.finish is not None:
                self.running.remove(req)
                self._release(req)
            news.append(req)
        return news

    def _lane_decodes(self, decodes: list[Request]) -> tuple[list[Request], int]:
        """Order ``decodes`` as the forward wants them: those with a lane first, by lane; return how many have one.

        A request gets a lane at its first decode (its KV is gathered from the pool once) and keeps it while the
        lanes' budget lets it grow; otherwise it decodes through the gather path."""
        lanes = self.lanes
        if not lanes.enabled or not decodes:
            return decodes, 0
        laned: list[Request] = []
        rest: list[Request] = []
        for req in decodes:
            room = req.computed + 1
            if lanes.lane(req) >= 0 and not lanes.reserve(room):
                lanes.release(req)
            elif lanes.lane(req) < 0 and (lane := lanes.assign(req, room)) >= 0:
                slots = self.req_to_token[req.row, : req.computed].long()
                lanes.fill(lane, self.k_pool[:, slots], self.v_pool[:, slots])
            (laned if lanes.lane(req) >= 0 else rest).append(req)
        laned.sort(key=lanes.lane)
        return laned + rest, len(laned)

    def _build(
        self,
        decodes: list[Request],
        num_lane: int,
        dec_slots: torch.Tensor | None,
        chunks: list[tuple[Request, int]],
        chunk_slots: list[torch.Tensor],
    ) -> ForwardBatch:
        dev = self.model.device
        ids: list[int] = [r.ids[-1] for r in decodes]
        pos: list[int] = [r.computed for r in decodes]
        out = [dec_slots] if dec_slots is not None else []
        nd, nl = len(decodes), num_lane
        dslots = dmask = lane_index = lane_mask = None
        if nd:
            assert dec_slots is not None
            rows = torch.tensor([r.row for r in decodes], device=dev)
            pos_t = torch.tensor(pos, device=dev)
            self.req_to_token[rows, pos_t] = dec_slots.to(torch.int32)
            if nd > nl:
                width = max(pos[nl:]) + 1
                dslots = self.req_to_token[rows[nl:], :width].long()
                dmask = (torch.arange(width, device=dev)[None, :] <= pos_t[nl:, None])[:, None, None, :]
        if nl:
            lanes = [self.lanes.lane(r) for r in decodes[:nl]]
            for lane, p in zip(lanes, pos, strict=False):
                self.lanes.lengths[lane] = p + 1
            if lanes != list(range(nl)):
                lane_index = torch.tensor(lanes, device=dev)
            width = max(pos[:nl]) + 1
            lane_mask = (torch.arange(width, device=dev)[None, :] <= pos_t[:nl, None])[:, None, None, :]
        prefills = []
        logit_rows = list(range(nd))
        start = nd
        for (req, take), slots in zip(chunks, chunk_slots, strict=True):
            lo, hi = req.computed, req.computed + take
            ids.extend(req.ids[lo:hi])
            pos.extend(range(lo, hi))
            out.append(slots)
            self.req_to_token[req.row, lo:hi] = slots.to(torch.int32)
            prefills.append((start, take, self.req_to_token[req.row, :hi].long()))
            start += take
            if hi == len(req.ids):
                logit_rows.append(start - 1)
        return ForwardBatch(
            input_ids=torch.tensor(ids, device=dev),
            positions=torch.tensor(pos, device=dev),
            out_slots=torch.cat(out),
            num_decode=nd,
            decode_slots=dslots,
            decode_mask=dmask,
            prefills=prefills,
            logit_rows=torch.tensor(logit_rows, dtype=torch.long, device=dev),  # may be empty: a middle chunk
            num_lane=nl,
            lane_index=lane_index,
            lane_mask=lane_mask,
            lane_k=self.lanes.k if nl else None,
            lane_v=self.lanes.v if nl else None,
        )

    @torch.inference_mode()  # the logits are an inference tensor: edits in place (bans, masks) need the mode
    def _sample(self, reqs: list[Request], logits: torch.Tensor) -> None:
        """Pick each request's next token; record its behaviour logprob (temperature-scaled distribution, renormalised
        over the tokens a constrained request's grammar allows: see `grammar`)."""
        if not reqs:
            return
        dev = logits.device
        constrained = [i for i, r in enumerate(reqs) if r.matcher is not None]
        if constrained:  # first: every later step (bans, temperature, top-p) sees only allowed tokens
            assert self.grammars is not None
            self.grammars.mask(logits, constrained, [reqs[i].matcher for i in constrained])
        for i, req in enumerate(reqs):  # end-of-sequence is not allowed before min_new_tokens
            if req.params.min_new_tokens and req.n_output < req.params.min_new_tokens:
                banned = list(req.stop_ids | (frozenset() if req.params.ignore_eos else self.eos_ids))
                kept = logits[i, banned].clone() if req.matcher is not None else None
                logits[i, banned] = float("-inf")
                if kept is not None and bool(torch.isinf(logits[i]).all()):  # a complete match may only end
                    logits[i, banned] = kept
        temps = torch.tensor([r.params.temperature for r in reqs], device=dev)
        greedy = temps < 1e-6  # as SGLang: a temperature this small means greedy
        scaled = logits / torch.where(greedy, torch.ones_like(temps), temps)[:, None]
        logprobs = torch.log_softmax(scaled, dim=-1)
        choice = logits.argmax(dim=-1)
        if not bool(greedy.all()):
            filtered = self._filter(reqs, scaled)
            # inverse-CDF sampling: one uniform draw per row instead of multinomial's one per vocabulary entry
            cdf = torch.softmax(filtered, dim=-1).cumsum_(dim=-1)
            u = torch.rand(len(reqs), 1, generator=self.generator, device=dev)
            for i, req in enumerate(reqs):
                if req.generator is not None:
                    u[i, 0] = torch.rand(1, generator=req.generator, device=dev)[0]
            u.mul_(cdf[:, -1:])  # the cumulative sum ends a rounding error away from 1
            drawn = (
                torch.searchsorted(cdf, u, side="right").squeeze(1).clamp_(max=cdf.shape[1] - 1)
            )  # never a 0-prob token
            choice = torch.where(greedy, choice, drawn)
        picked = logprobs.gather(1, choice[:, None]).squeeze(1)
        top_k = max(r.top_logprobs_num for r in reqs)
        tops = torch.topk(logprobs, min(top_k, logprobs.shape[1])) if top_k else None
        tokens = choice.tolist()
        for i, (req, token, lp) in enumerate(zip(reqs, tokens, picked.tolist(), strict=True)):
            req.ids.append(token)
            if req.return_logprob:
                req.logprobs.append(lp)
                if tops is not None and req.top_logprobs_num:
                    k = req.top_logprobs_num
                    vals, idx = tops.values[i, :k].tolist(), tops.indices[i, :k].tolist()
                    req.top_logprobs.append(list(zip(vals, idx, strict=True)))
        if constrained:
            matchers = [reqs[i].matcher for i in constrained]
            accepted = Grammars.accept(matchers, [tokens[i] for i in constrained])
            for i, ok in zip(constrained, accepted, strict=True):
                if not ok:  # the mask allowed it, so this is a bug: end the request, not the engine
                    reqs[i].finish = {
                        "type": "abort",
                        "message": f"the grammar refused sampled token {tokens[i]} (constrained decoding bug)",
                    }

    @staticmethod
    def _filter(reqs: list[Request], scaled: torch.Tensor) -> torch.Tensor:
        """Apply top-k, top-p and min-p (per row) to temperature-scaled logits."""
        top_ks = [r.params.top_k if r.params.top_k > 0 else scaled.shape[1] for r in reqs]
        top_ps = [r.params.top_p for r in reqs]
        min_ps = [r.params.min_p for r in reqs]
        if all(k >= scaled.shape[1] for k in top_ks) and all(p >= 1.0 for p in top_ps) and not any(min_ps):
            return scaled
        dev = scaled.device
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        ranks = torch.arange(scaled.shape[1], device=dev)[None, :]
        drop = ranks >= torch.tensor(top_ks, device=dev)[:, None]
        cum = probs.cumsum(dim=-1) - probs  # mass strictly before each token: the first token is always kept
        drop |= cum > torch.tensor(top_ps, device=dev)[:, None]
        drop |= probs < (probs[:, :1] * torch.tensor(min_ps, device=dev)[:, None])
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        return torch.empty_like(scaled).scatter_(1, order, sorted_logits)

    def _check_finish(self, req: Request) -> None:
        p = req.params
        token = req.ids[-1]
        n_out = req.n_output
        if req.matcher is not None and req.matcher.is_terminated():  # the grammar ended it (even ignore_eos)
            req.finish = {"type": "stop", "matched": token}
            return
        if (
            not p.ignore_eos and token in self.eos_ids
        ) or token in req.stop_ids:  # banned before min_new_tokens
            req.finish = {"type": "stop", "matched": token}
            return
        if p.max_new_tokens is not None and n_out >= p.max_new_tokens:
            req.finish = {"type": "length", "length": n_out}
            return
        if len(req.ids) >= self.context_length:
            req.finish = {"type": "length", "length": n_out}
            return
        stops = p.stop_strings
        if stops and self.decode_text is not None:
            window = _STOP_WINDOW_PER_CHAR * max(len(s) for s in stops) + 1
            tail = self.decode_text(req.output_ids[-window:])
            for s in stops:
                if s in tail:
                    req.finish = {"type": "stop", "matched": s}
                    return

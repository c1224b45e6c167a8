"""The pool of inference engines a router sends calls to, and the one loop that makes a call survive them.

Each engine is ``serving``, ``draining``, ``gone``, ``hung`` or ``misconfigured``. An engine a controller manages (a
cell's) changes state only when the controller says so (``drain``, ``resume``, ``mark_gone``), never by a health
probe, with one exception: ``hung``. The controller hears the cell, not its engine, so while calls are in flight on
an engine the pool itself asks it for ``/health`` every second; one that has not answered within
``probe_timeout_s`` for ``hung_after_s`` (stopped, deadlocked, its host unreachable with sockets still open) is
``hung``: its calls in flight continue elsewhere as after a crash, and it serves again once it answers. Generation
time plays no part in the judgement, so a long prefill on an engine that still answers its probe is never cut. A
call sticks to the engine that holds its
session's prefix while that engine serves, else goes to the least loaded one. When its engine drains or fails
mid-generation, the call continues on another engine from the tokens generated so far (its KV handed over where both
engines can), so the caller sees one normal response whose tokens and logprobs are exactly what the engines sampled,
each token with the weight version of the engine that sampled it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import msgspec

from gyre.engine.engineclient import EngineClient
from gyre.engine.http import LocalResourceError
from gyre.errors import (
    EngineCapacityError,
    EngineError,
    EngineHung,
    EngineRequestError,
    EngineUnavailable,
    ProtocolError,
)
from gyre.journal.records import RecordSource
from gyre.protocol import GenerateResponse, SamplingParams, parse_weight_version

if TYPE_CHECKING:
    from gyre.config import RouterConfig

log = logging.getLogger(__name__)
PROBE_INTERVAL_S = 1.0  # gone engines (none serving), busy and hung ones are asked for /health this often
ABORT_WAIT_S = (
    10.0  # an aborted call waits this long for its engine to stop, asking again every ABORT_RETRY_S
)
ABORT_RETRY_S = 0.2


class EngineState(enum.Enum):
    """Where an engine stands for the router."""

    SERVING = "serving"
    DRAINING = "draining"
    GONE = "gone"
    # stopped answering /health while calls were in flight (``hung_after_s``): gets no calls; serves again, managed
    # or not, once it answers
    HUNG = "hung"
    # answered what Gyre cannot record (a non-integer weight version): gets no calls, and no health probe brings
    # it back; `EnginePool.resume` does, once it is fixed
    MISCONFIGURED = "misconfigured"


class NoCapacity(EngineError):
    """No engine served within the wait, or the call's retry budget is spent (HTTP 503)."""


class CallAborted(EngineError):
    """The caller aborted its call before any engine produced anything: there is nothing to record."""


class CallControl:
    """A caller's handle on one call in flight.

    ``abort`` stops the engine request; the call then ends as usual, with the tokens generated so far and finish
    ``abort`` (or ``CallAborted`` if no engine answered yet). The pool announces each engine attempt here.
    """

    def __init__(self) -> None:
        self.aborted = False
        self._attempt: tuple[Engine, str] | None = None  # (engine, rid) of the attempt in flight
        self._attempt_ended = asyncio.Event()

    def begin(self, engine: Engine, rid: str) -> None:
        """(pool) An engine attempt starts."""
        self._attempt = (engine, rid)
        self._attempt_ended.clear()

    def end(self) -> None:
        """(pool) The attempt in flight ended."""
        self._attempt = None
        self._attempt_ended.set()

    async def wait_attempt_ended(self, timeout_s: float) -> None:
        """Return when no attempt is in flight, or after ``timeout_s``."""
        if self._attempt is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._attempt_ended.wait()

    async def abort(self) -> None:
        """Stop the call's engine request; returns once it stopped (at most ``ABORT_WAIT_S``)."""
        self.aborted = True
        deadline = time.monotonic() + ABORT_WAIT_S
        # The engine may not know the rid yet (the request is still on its way) or the call may be between two
        # attempts: ask again until the attempt in flight ends.
        while (attempt := self._attempt) is not None and time.monotonic() < deadline:
            engine, rid = attempt
            with contextlib.suppress(EngineError, TimeoutError):
                async with asyncio.timeout(2.0):
                    await engine.client.abort(rid)
            await self.wait_attempt_ended(ABORT_RETRY_S)


def engine_url(url: str) -> str:
    """``url`` as an engine base URL (``http(s)://host[:port][/path]``, no trailing slash); EngineRequestError if
    it is not one."""
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError when out of range or not a number
    except ValueError as exc:
        raise EngineRequestError(f"engine URL {url!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EngineRequestError(f"engine URL {url!r} must be http://host:port or https://host:port")
    if parts.query or parts.fragment or parts.username or parts.password or port == 0:
        raise EngineRequestError(f"engine URL {url!r} must be http://host:port[/path], nothing more")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise EngineRequestError(f"engine URL {url!r} holds whitespace or control characters")
    return url.rstrip("/")


@dataclass(eq=False)
class Engine:
    """One engine as the router sees it."""

    name: str
    url: str
    client: EngineClient
    state: EngineState = EngineState.SERVING
    outstanding_tokens: int = 0  # prompt + budgeted output tokens of calls in flight here
    inflight: set[str] = field(default_factory=set)  # rids in flight here
    handovers: int = 0  # KV hand-overs waiting on it now (probed like calls in flight)
    kv_handover: bool = True  # cleared once the engine shows it lacks the extension
    calls: int = 0
    failures: int = 0
    last_probe: float = 0.0  # time.monotonic() of the last health probe while gone
    problem: str = ""  # why it is misconfigured
    managed: bool = False  # a controller owns its state (a cell's engine): no health probe revives it
    destination: str | None = None  # while draining: where its moved calls continue (capacity reserved there)
    silent_since: float | None = None  # time.monotonic() at the start of the first unanswered probe in a row
    probes: int = 0  # liveness probes sent while it was busy or hung
    waits: set[asyncio.Timeout] = field(
        default_factory=set
    )  # calls' waits on it: expired when it is judged hung


class PoolStatistics(msgspec.Struct, frozen=True):
    """Load and history of the pool."""

    engines: dict[str, str]  # name -> state
    outstanding_tokens: dict[str, int]
    inflight_calls: int
    moved_calls: int  # continuations started after a drain or failure
    kv_handovers: int
    engine_failures: int
    local_connect_failures: int = 0  # connections this process could not open (descriptors, ports): retried
    hung_engines: int = 0  # times an engine was judged hung (its calls moved)


@dataclass
class Chunk:
    """Tokens that arrived on a streamed call, with their behaviour logprobs."""

    ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[float, int]]]


@dataclass
class Generation:
    """What one call produced, possibly across several engines."""

    output_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[float, int]]]
    finish_reason: dict[str, object]
    weight_version: int  # of the first output token (no output: of the engine that finished the call)
    engine: str  # the engine that finished it
    engines: list[str]  # every engine that contributed, in order
    first_token_s: float | None
    versions: list[int]  # the weight version that sampled each output token
    source: RecordSource  # "scripted" when any engine that answered the call is scripted, else "policy"


class EnginePool:
    """Engines, their states, and call placement with transparent continuation."""

    def __init__(
        self,
        wait_for_engine_s: float = 60.0,
        retry_budget: int = 8,
        timeout_s: float = 3600.0,
        probe_timeout_s: float = 5.0,
        hung_after_s: float = 30.0,
    ) -> None:
        self.wait_for_engine_s = wait_for_engine_s
        self.retry_budget = retry_budget
        self.timeout_s = timeout_s
        self.probe_timeout_s = probe_timeout_s
        self.hung_after_s = hung_after_s
        self._watch: asyncio.Task[None] | None = None  # probes busy and hung engines; ends when none is left
        self._hung = 0
        self.engines: dict[str, Engine] = {}
        self._changed = asyncio.Event()
        self._names = itertools.count()
        self._moved = 0
        self._handovers = 0
        self._failures = 0
        self._local_failures = 0  # connections this process could not open (descriptors, ports)

    @classmethod
    def from_config(cls, cfg: RouterConfig) -> EnginePool:
        """A pool with the waits, budget and liveness deadlines of ``[router]``."""
        return cls(cfg.wait_for_engine_s, cfg.retry_budget, cfg.request_timeout_s, cfg.probe_timeout_s,
                   cfg.hung_after_s)  # fmt: skip

    # ---- membership -----------------------------------------------------------------------------------------
    def add(self, url: str, name: str | None = None, managed: bool = False) -> Engine:
        """Start sending calls to the engine at ``url`` (``managed``: a controller decides its state)."""
        url = engine_url(url)
        name = name or f"engine-{next(self._names)}"
        if name in self.engines and self.engines[name].state is not EngineState.GONE:
            raise EngineRequestError(f"an engine named {name!r} is already in the pool", status=409)
        engine = Engine(name, url, EngineClient(url, timeout_s=self.timeout_s), managed=managed)
        self.engines[name] = engine
        self._notify()
        return engine

    def get(self, name: str) -> Engine:
        """The engine called ``name``."""
        engine = self.engines.get(name)
        if engine is None:
            raise EngineRequestError(f"no engine named {name!r}; engines: {sorted(self.engines)}", status=404)
        return engine

    def hold(self, name: str, destination: str | None = None) -> Engine:
        """Send no new calls to ``name``; its calls in flight go on until `drain` moves them (to ``destination``).
        Routers that share an engine (shards) are all held before any drains: a drain aborts every call there."""
        engine = self.get(name)
        engine.destination = destination
        if engine.state in (EngineState.SERVING, EngineState.HUNG):
            engine.state = EngineState.DRAINING
        return engine

    async def drain(self, name: str, destination: str | None = None) -> None:
        """Send no new calls to ``name``; move its in-flight calls elsewhere (to ``destination`` while it serves);
        return when none is left there."""
        engine = self.hold(name, destination)
        while engine.inflight and engine.state is EngineState.DRAINING:
            try:  # the router is the engine's only client: abort everything, until nothing is in flight
                await engine.client.abort(abort_all=True)
            except EngineError as exc:
                self._mark_gone(engine, f"abort while draining failed: {exc}")
                break
            await asyncio.sleep(0.02)

    def resume(self, name: str) -> None:
        """Let a drained engine (back from training, say) or a fixed misconfigured one serve again."""
        engine = self.get(name)
        engine.state = EngineState.SERVING
        engine.problem, engine.destination, engine.silent_since = "", None, None
        self._notify()

    def mark_gone(self, name: str, reason: str) -> None:
        """The controller declared the engine's cell gone: no calls; calls in flight there continue elsewhere."""
        self._mark_gone(self.get(name), reason)

    def forget(self, name: str) -> None:
        """Drop ``name`` from the pool at once (a cell that came back at a new address replaces it)."""
        self.engines.pop(name, None)

    async def remove(self, name: str) -> None:
        """Drain ``name`` and forget it."""
        await self.drain(name)
        engine = self.engines.pop(name)
        await engine.client.aclose()

    async def aclose(self) -> None:
        """Stop probing; close every engine client."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        for engine in self.engines.values():
            await engine.client.aclose()

    def serving(self) -> list[Engine]:
        """Engines taking new calls."""
        return [e for e in self.engines.values() if e.state is EngineState.SERVING]

    def statistics(self) -> PoolStatistics:
        """A snapshot of states and load."""
        return PoolStatistics(
            engines={n: e.state.value for n, e in self.engines.items()},
            outstanding_tokens={n: e.outstanding_tokens for n, e in self.engines.items()},
            inflight_calls=sum(len(e.inflight) for e in self.engines.values()),
            moved_calls=self._moved,
            kv_handovers=self._handovers,
            engine_failures=self._failures,
            local_connect_failures=self._local_failures,
            hung_engines=self._hung,
        )

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _mark_gone(self, engine: Engine, reason: object = "") -> None:
        if engine.state is not EngineState.GONE:
            log.warning("engine %s (%s) is gone: %s", engine.name, engine.url, reason)
            engine.state = EngineState.GONE
            engine.failures += 1
            self._failures += 1
            self._notify()

    def _mark_misconfigured(self, engine: Engine, problem: object) -> None:
        if engine.state is not EngineState.MISCONFIGURED:
            log.error("engine %s (%s) is misconfigured; it gets no calls until resumed: %s",
                      engine.name, engine.url, problem)  # fmt: skip
            engine.state = EngineState.MISCONFIGURED
            engine.problem = str(problem)
            engine.failures += 1
            self._notify()

    # ---- liveness ---------------------------------------------------------------------------------------------
    def _ensure_watch(self) -> None:
        """Probe busy engines while any call is in flight: started by the first attempt, it ends by itself."""
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(
                self._watch_engines(), name="gyre-pool-liveness"
            )

    async def _watch_engines(self) -> None:
        """Every ``PROBE_INTERVAL_S``, ask engines with calls in flight (and hung ones) for ``/health``, at most
        ``probe_timeout_s`` each, concurrently; returns once none is busy or hung."""
        while True:
            await asyncio.sleep(PROBE_INTERVAL_S)
            watched = [
                e for e in self.engines.values()
                if e.state is EngineState.HUNG
                or ((e.inflight or e.handovers) and e.state in (EngineState.SERVING, EngineState.DRAINING))
            ]  # fmt: skip
            if not watched:
                return
            await asyncio.gather(*(self._probe(e) for e in watched))

    async def _probe(self, engine: Engine) -> None:
        """One liveness probe: an answer revives a hung engine; silence for ``hung_after_s`` makes a busy one hung."""
        asked = time.monotonic()
        engine.probes += 1
        try:
            async with asyncio.timeout(self.probe_timeout_s):
                alive = await engine.client.health()
        except TimeoutError:
            alive = False
        now = time.monotonic()
        if alive:
            engine.silent_since = None
            if engine.state is EngineState.HUNG:
                log.warning("engine %s (%s) answers again: serving", engine.name, engine.url)
                engine.state = EngineState.SERVING
                self._notify()
            return
        silent = engine.silent_since = engine.silent_since or asked
        if now - silent >= self.hung_after_s and engine.state in (EngineState.SERVING, EngineState.DRAINING):
            log.warning("engine %s (%s) has not answered /health for %.1f s: hung; its %d calls move",
                        engine.name, engine.url, now - silent, len(engine.inflight))  # fmt: skip
            engine.state = EngineState.HUNG
            engine.failures += 1
            self._hung += 1
            for wait in engine.waits:
                wait.reschedule(asyncio.get_running_loop().time())
            self._notify()

    @contextlib.asynccontextmanager
    async def _waiting_on(self, engine: Engine) -> AsyncIterator[None]:
        """A wait for ``engine``'s answer, cut short (``EngineHung``) when the engine is judged hung."""
        try:
            async with asyncio.timeout(None) as wait:
                engine.waits.add(wait)
                try:
                    if engine.state is EngineState.HUNG:
                        wait.reschedule(asyncio.get_running_loop().time())
                    yield
                finally:
                    engine.waits.discard(wait)
        except TimeoutError:
            if wait.expired() and engine.state is EngineState.HUNG:
                raise EngineHung(f"{engine.url}: no answer to /health for {self.hung_after_s:g} s") from None
            raise

    async def _pick(self, affinity: str | None, moved_from: Engine | None = None) -> Engine:
        """The session's engine while it serves, else the least loaded serving one; waits for one to appear. A call
        moved off a draining engine goes where the controller reserved capacity for it, if that still serves."""
        deadline = time.monotonic() + self.wait_for_engine_s
        while True:
            reserved = self.engines.get(moved_from.destination or "") if moved_from is not None else None
            if reserved is not None and reserved.state is EngineState.SERVING:
                return reserved
            sticky = self.engines.get(affinity) if affinity else None
            if sticky is not None and sticky.state is EngineState.SERVING:
                return sticky
            candidates = self.serving()
            if candidates:
                return min(candidates, key=lambda e: e.outstanding_tokens)
            await self._probe_gone()
            if self.serving():
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                wrong = [e.problem for e in self.engines.values() if e.state is EngineState.MISCONFIGURED]
                raise NoCapacity(
                    f"no engine is serving (waited {self.wait_for_engine_s:g} s)"
                    + "".join(f"; misconfigured: {problem}" for problem in wrong)
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(left, PROBE_INTERVAL_S))

    async def _probe_gone(self) -> None:
        """Bring back gone engines that answer ``/health`` again (a restart, a transient failure)."""
        now = time.monotonic()
        for engine in self.engines.values():
            if (
                engine.state is EngineState.GONE
                and not engine.managed
                and now - engine.last_probe >= PROBE_INTERVAL_S
            ):
                engine.last_probe = now
                if await engine.client.health():
                    log.warning("engine %s (%s) answers again: serving", engine.name, engine.url)
                    engine.state = EngineState.SERVING
                    self._notify()

    # ---- one call ---------------------------------------------------------------------------------------------
    async def generate(
        self,
        input_ids: list[int],
        params: SamplingParams,
        affinity: str | None = None,
        top_logprobs_num: int = 0,
        control: CallControl | None = None,
    ) -> Generation:
        """Generate to the end, continuing on another engine whenever the current one drains or fails."""
        async for item in self._run(input_ids, params, affinity, top_logprobs_num, False, control):
            if isinstance(item, Generation):
                return item
        raise AssertionError("a call ends with its Generation")

    def generate_stream(
        self,
        input_ids: list[int],
        params: SamplingParams,
        affinity: str | None = None,
        top_logprobs_num: int = 0,
        control: CallControl | None = None,
    ) -> AsyncIterator[Chunk | Generation]:
        """The same call, streamed: a ``Chunk`` per batch of new tokens, then the ``Generation``."""
        return self._run(input_ids, params, affinity, top_logprobs_num, True, control)

    async def _run(
        self,
        input_ids: list[int],
        params: SamplingParams,
        affinity: str | None,
        top: int,
        stream: bool,
        control: CallControl | None,
    ) -> AsyncIterator[Chunk | Generation]:
        out: list[int] = []
        logprobs: list[float] = []
        tops: list[list[tuple[float, int]]] = []
        versions: list[int] = []  # one per token of ``out``
        engines: list[str] = []
        version = 0  # of the last engine that answered
        source: RecordSource = "policy"
        first_token_s: float | None = None
        failures = 0
        pressure_until: float | None = None  # while this process lacks descriptors or ports: retry until then
        pressure_retries = 0
        backoff_s = 0.0
        previous: Engine | None = None
        limit = params.max_new_tokens
        control = control or CallControl()
        resp: GenerateResponse | None = None
        engine: Engine | None = None
        while True:
            if backoff_s:
                await asyncio.sleep(backoff_s)
                backoff_s = 0.0
            if control.aborted:  # between attempts: end with what the engines produced so far
                if engine is None or not (engines or out):
                    raise CallAborted("the caller aborted the call before an engine answered")
                finish: dict[str, object] = {"type": "abort", "message": "aborted by the caller"}
                yield self._generation(out, logprobs, tops, finish, versions, version, engine, engines,
                                       first_token_s, source)  # fmt: skip
                return
            engine = await self._pick(affinity, previous)
            if previous is not None and previous is not engine and out:
                await self._hand_over(previous, engine, input_ids + out)
            budget = None if limit is None else limit - len(out)
            attempt = msgspec.structs.replace(
                params, max_new_tokens=budget, min_new_tokens=max(params.min_new_tokens - len(out), 0)
            )
            rid = uuid.uuid4().hex
            cost = len(input_ids) + len(out) + (budget or 0)
            engine.inflight.add(rid)
            engine.outstanding_tokens += cost
            engine.calls += 1
            resp = None
            finished = False
            reached = True  # the request may have reached the engine
            control.begin(engine, rid)
            self._ensure_watch()
            try:
                if stream:
                    seen = 0
                    chunks = engine.client.generate_stream(
                        input_ids + out, attempt, rid=rid, return_logprob=True, top_logprobs_num=top
                    )
                    async with contextlib.aclosing(chunks):
                        while True:  # each chunk's version, before its tokens
                            async with self._waiting_on(engine):
                                got = await anext(chunks, None)
                            if got is None:
                                break
                            resp = got
                            version, scripted = self._provenance(engine, resp)
                            source = "scripted" if scripted else source
                            if len(resp.output_ids) > seen:
                                first_token_s = first_token_s or time.time()
                                chunk = self._append(resp, seen, version, out, logprobs, tops, versions, top)
                                seen = len(resp.output_ids)
                                yield chunk
                    if resp is None:
                        raise EngineUnavailable(f"{engine.url}: the stream ended without a response")
                else:
                    async with self._waiting_on(engine):
                        resp = await engine.client.generate(
                            input_ids + out, attempt, rid=rid, return_logprob=True, top_logprobs_num=top
                        )
                    version, scripted = self._provenance(engine, resp)
                    source = "scripted" if scripted else source
                    if resp.output_ids:
                        first_token_s = first_token_s or time.time()
                    self._append(resp, 0, version, out, logprobs, tops, versions, top)
                finished = True
            except (EngineCapacityError, EngineRequestError):
                raise
            except LocalResourceError as exc:
                # Our own process is out of descriptors or local ports (a burst of connections): the engine is
                # fine, so it is not marked gone; the call retries once some are freed, within the engine wait.
                now = time.monotonic()
                pressure_until = pressure_until or now + self.wait_for_engine_s
                if now >= pressure_until:
                    raise NoCapacity(f"could not connect for {self.wait_for_engine_s:g} s: {exc}") from exc
                self._local_failures += 1
                pressure_retries += 1
                log.warning(
                    "no connection to engine %s for lack of local resources; retrying: %s", engine.name, exc
                )
                previous, reached = None, False
                backoff_s = min(0.05 * 2**pressure_retries, 1.0)
                continue
            except EngineHung as exc:
                # Like a crash, minus the mark: the engine stays hung until it answers its probe again.
                failures += 1
                if failures > self.retry_budget:
                    raise NoCapacity(f"gave up after {failures} engine failures; last: {exc}") from exc
                previous = None  # a hung engine exports nothing; tokens streamed so far are kept
                self._moved += 1
                continue
            except (EngineUnavailable, ProtocolError) as exc:
                # An engine whose answer cannot be recorded is misconfigured, not the caller's problem: its
                # tokens of this attempt are dropped (tokens of earlier chunks, recorded correctly, are kept)
                # and the call goes on elsewhere like after a crash; with no other engine, the caller gets the
                # 503 of an empty pool, which names the misconfiguration. Never a record with a made-up version.
                if isinstance(exc, ProtocolError):
                    self._mark_misconfigured(engine, exc)
                else:
                    self._mark_gone(engine, exc)
                failures += 1
                if failures > self.retry_budget:
                    raise NoCapacity(f"gave up after {failures} engine failures; last: {exc}") from exc
                previous = None  # nothing can be exported from a dead engine; tokens streamed so far are kept
                self._moved += 1
                continue
            finally:
                control.end()
                engine.inflight.discard(rid)
                engine.outstanding_tokens -= cost
                gone = engine.state in (EngineState.GONE, EngineState.HUNG)
                if not finished and reached and not gone:  # the caller went away
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(5):
                            await engine.client.abort(rid)
            assert resp is not None
            engines.append(engine.name)
            moved = (
                resp.finish_type == "abort"
                and engine.state is not EngineState.SERVING
                and not control.aborted
            )
            if moved and (budget is None or len(resp.output_ids) < budget):
                previous = engine
                self._moved += 1
                continue
            finish = dict(resp.meta_info.finish_reason or {"type": "abort"})
            if moved:
                finish = {"type": "length", "length": len(out)}
            yield self._generation(
                out, logprobs, tops, finish, versions, version, engine, engines, first_token_s, source
            )
            return

    @staticmethod
    def _generation(
        out: list[int],
        logprobs: list[float],
        tops: list[list[tuple[float, int]]],
        finish: dict[str, object],
        versions: list[int],
        version: int,
        engine: Engine,
        engines: list[str],
        first_token_s: float | None,
        source: RecordSource,
    ) -> Generation:
        first_version = versions[0] if versions else version
        return Generation(
            out, logprobs, tops, finish, first_version, engine.name, engines, first_token_s, versions, source
        )

    @staticmethod
    def _provenance(engine: Engine, resp: GenerateResponse) -> tuple[int, bool]:
        """The weight version of a response's tokens and whether a script wrote them; ProtocolError if unclear."""
        where = f"engine {engine.name} ({engine.url})"
        version = parse_weight_version(resp.meta_info.weight_version, where)
        if resp.meta_info.gyre_source not in ("policy", "scripted"):
            raise ProtocolError(f"{where}: unknown gyre_source {resp.meta_info.gyre_source!r}")
        return version, resp.meta_info.gyre_source == "scripted"

    @staticmethod
    def _append(
        resp: GenerateResponse,
        seen: int,
        version: int,
        out: list[int],
        logprobs: list[float],
        tops: list[list[tuple[float, int]]],
        versions: list[int],
        top: int,
    ) -> Chunk:
        """Take the tokens of a (cumulative) response past ``seen``, sampled at ``version``, into the lists."""
        ids = resp.output_ids[seen:]
        lps = resp.output_logprobs[seen:]
        new_tops = []
        if top:
            for entry in (resp.meta_info.output_top_logprobs or [])[seen:]:
                new_tops.append([(float(lp), int(t)) for lp, t, _ in entry or []])
        out.extend(ids)
        logprobs.extend(lps)
        tops.extend(new_tops)
        versions.extend([version] * len(ids))
        return Chunk(ids, lps, new_tops)

    async def _hand_over(self, source: Engine, dest: Engine, ids: list[int]) -> None:
        """Copy the moved call's KV from the engine it left to the one continuing it, where both can."""
        if not (source.kv_handover and dest.kv_handover) or source.state is EngineState.GONE:
            return
        source.handovers += 1
        dest.handovers += 1
        self._ensure_watch()
        try:  # either engine may hang: its probe cuts the wait short, as for a call, and the prefix is recomputed
            async with self._waiting_on(source):
                blob = await source.client.export_kv(ids)
            async with self._waiting_on(dest):
                await dest.client.import_kv(blob)
            self._handovers += 1
        except EngineHung as exc:
            log.info("KV hand-over %s -> %s given up: %s", source.name, dest.name, exc)
        except EngineRequestError as exc:
            if exc.status in (404, 405):  # not an embedded engine: it will recompute the prefix
                (dest if "import" in str(exc) else source).kv_handover = False
            log.info("KV hand-over %s -> %s skipped: %s", source.name, dest.name, exc)
        except EngineError as exc:
            log.info(
                "KV hand-over %s -> %s failed, the prefix is recomputed: %s", source.name, dest.name, exc
            )
        finally:
            source.handovers -= 1
            dest.handovers -= 1

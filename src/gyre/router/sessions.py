"""Sessions: one per execution, each with its calls, its token-exact records and what TITO needs to extend them.

A session only ever sees its own records: every lookup goes through the session token. `CallGate` admits the
sessions' calls: one session's flood waits behind its own limit, never in front of another session's call.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gyre.journal.records import ApiCallRecord, CallRecord


@dataclass(eq=False, slots=True)
class IdSpan:
    """The first ``length`` ids of ``buffer``: one call's token-exact ids, sharing a buffer with the calls before it.

    Buffers only grow at their end, so ``buffer[:length]`` of a span never changes. A chain of calls shares one
    buffer: extending the span that ends at its buffer's end appends in place (cost: the new ids). Extending any
    other span (a branch from an older turn, or a second call from the same turn) copies its ids once into a new
    buffer. Every span ``extend`` returns is the only one ending at its buffer's end, so while a call is in flight
    the buffer holding its input can grow only by that call's own output: the engine may hold the list meanwhile.
    """

    buffer: list[int]
    length: int

    @classmethod
    def of(cls, ids: list[int]) -> IdSpan:
        """A span of all of ``ids``; the list becomes the span's buffer (the caller stops changing it)."""
        return cls(ids, len(ids))

    def extend(self, ids: list[int]) -> IdSpan:
        """The span of these ids followed by ``ids``: in place when this span ends its buffer, else a copy."""
        if ids and self.length == len(self.buffer):
            self.buffer.extend(ids)
            return IdSpan(self.buffer, len(self.buffer))
        buffer = self.buffer[: self.length]  # a branch, or nothing to append: a buffer of its own
        buffer.extend(ids)
        return IdSpan(buffer, len(buffer))

    def ids(self) -> list[int]:
        """The span's ids, not to be changed: its buffer itself while the span ends it (no copy), else a copy."""
        return self.buffer if self.length == len(self.buffer) else self.buffer[: self.length]

    def copy(self) -> list[int]:
        """The span's ids in a new list."""
        return self.buffer[: self.length]

    def __len__(self) -> int:
        return self.length


@dataclass(eq=False)
class Turn:
    """A finished chat call that a later request may extend token-exactly.

    Only leaves are kept: once a call extends this one, its messages are dropped, and the ids are shared with
    the calls on its line (`IdSpan`), so a session's memory grows with its tokens, not with turns x tokens.
    """

    call_id: str
    raw_messages: list[dict[str, Any]]  # the messages exactly as the client sent them
    tools: list[dict[str, Any]] | None
    reply: dict[str, Any]  # our assistant reply, normalised (what the client must echo back)
    full: IdSpan  # input + output: the prefix of any call that extends this one
    output_ids: list[int]  # the ids the engine produced (the tail of ``full``)


@dataclass(eq=False)
class Session:
    """An execution's router session."""

    token: str
    execution_id: str
    records: list[CallRecord] = field(default_factory=list)
    api_calls: list[ApiCallRecord] = field(default_factory=list)  # calls to an outside model (UpstreamRouter)
    leaves: dict[int, list[Turn]] = field(
        default_factory=dict
    )  # len(raw_messages) -> turns nobody extended yet
    tool_payloads: dict[str, dict[str, Any]] = field(default_factory=dict)  # tool-call id -> what we returned
    affinity: str | None = None  # engine holding this session's prefix
    calls: int = 0
    closed: bool = False
    # admission (`CallGate`): calls running and waiting now, the most that ran at once, calls that had to wait
    running: int = 0
    # (arrival, wake-up) of each waiting call, oldest first
    waiting: deque[tuple[int, asyncio.Future[None]]] = field(default_factory=deque)
    peak_running: int = 0
    waited: int = 0

    def remember(self, turn: Turn, extended: Turn | None) -> None:
        """Index a finished call as a leaf; the call it extended stops being one."""
        if extended is not None:
            siblings = self.leaves.get(len(extended.raw_messages), [])
            if extended in siblings:
                siblings.remove(extended)
                if not siblings:
                    del self.leaves[len(extended.raw_messages)]
        self.leaves.setdefault(len(turn.raw_messages), []).append(turn)

    def find_extended(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> Turn | None:
        """The longest leaf call whose messages are a prefix of ``messages`` followed by our reply.

        Looks only at the lengths that have leaves. The prefix is compared exactly, as the client sent it: a match
        is never assumed from a digest. That comparison reads the history (C-speed equality; free for message
        objects the caller passes again, as in-process agents do) and is the one per-call step left that grows
        with it. The reply is checked by the caller after restoring tool-call payloads.
        """
        for length in sorted((n for n in self.leaves if n < len(messages)), reverse=True):
            for turn in reversed(self.leaves[length]):
                last_matches = messages[length - 1] == turn.raw_messages[-1]  # cheap test before the full one
                if last_matches and turn.tools == tools and messages[:length] == turn.raw_messages:
                    return turn
        return None


class SessionStore:
    """Live sessions by token."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}

    def open(self, execution_id: str | None = None) -> Session:
        """A new session with an unguessable token."""
        token = "gyre-" + secrets.token_urlsafe(18)
        session = Session(token=token, execution_id=execution_id or token)
        self._sessions[token] = session
        return session

    def get(self, token: str) -> Session | None:
        """The session for ``token``, or None."""
        return self._sessions.get(token)

    def close(self, token: str) -> Session | None:
        """Forget a session (its records stay in the journal); returns it."""
        session = self._sessions.pop(token, None)
        if session is not None:
            session.closed = True
        return session

    def __len__(self) -> int:
        return len(self._sessions)


class CallStatistics(msgspec.Struct, frozen=True):
    """One session's calls at the gate."""

    execution_id: str
    running: int  # admitted and not yet answered
    waiting: int  # behind the session's own limit (or the router's cap)
    peak_running: int  # the most that ran at once
    waited: int  # calls that were not admitted at once
    calls: int  # calls recorded


class CallGate:
    """Admits calls: at most ``per_session`` of one session's at once and, when ``total`` > 0, at most ``total``
    in all. A call past either waits. A freed slot goes to the waiting session with the fewest calls running
    (ties: the one whose oldest call waited longest), and a session's calls are admitted in their order.

    So a session that floods the router holds ``per_session`` calls at most, its other calls wait behind those,
    and a session making one call at a time is never behind it. Waiting costs a future per call: the request's
    body is not read until its call is admitted (the connection's flow control holds the rest).
    """

    def __init__(self, per_session: int, total: int = 0) -> None:
        self.per_session, self.total = per_session, total
        self.running = 0
        self._queued: dict[str, Session] = {}  # sessions with calls waiting, by token
        self._arrivals = itertools.count()

    @contextlib.asynccontextmanager
    async def admit(self, session: Session) -> AsyncIterator[None]:
        """Hold a slot for one of ``session``'s calls while the block runs (waiting for one first if need be)."""
        if session.waiting or not self._room(session):
            session.waited += 1
            wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (next(self._arrivals), wake)
            session.waiting.append(entry)
            self._queued[session.token] = session
            try:
                await wake
            except BaseException:
                if wake.done() and not wake.cancelled():  # admitted as it was cancelled: give the slot back
                    self._release(session)
                else:
                    session.waiting.remove(entry)
                    if not session.waiting:
                        self._queued.pop(session.token, None)
                    self._wake(session)  # it may have held up the session's later calls
                raise
        else:
            self._start(session)
        try:
            yield
        finally:
            self._release(session)

    def _room(self, session: Session) -> bool:
        return session.running < self.per_session and not (self.total and self.running >= self.total)

    def _start(self, session: Session) -> None:
        session.running += 1
        session.peak_running = max(session.peak_running, session.running)
        self.running += 1

    def _release(self, session: Session) -> None:
        session.running -= 1
        self.running -= 1
        self._wake(session)

    def _wake(self, freed: Session | None = None) -> None:
        """Admit waiting calls while there is room: the session with the fewest running first. Without a cap only
        ``freed``'s own calls can have been waiting for the slot it freed: one look, not one per queued session."""
        while self._queued and not (self.total and self.running >= self.total):
            if self.total or freed is None:
                ready = [s for s in self._queued.values() if s.running < self.per_session]
            else:
                ready = [freed] if freed.waiting and freed.running < self.per_session else []
            if not ready:
                return
            session = min(ready, key=lambda s: (s.running, s.waiting[0][0]))
            _, wake = session.waiting.popleft()
            if not session.waiting:
                del self._queued[session.token]
            self._start(session)
            wake.set_result(None)

    def statistics(self, session: Session) -> CallStatistics:
        """``session``'s calls at the gate."""
        return CallStatistics(session.execution_id, session.running, len(session.waiting), session.peak_running,
                              session.waited, session.calls)  # fmt: skip

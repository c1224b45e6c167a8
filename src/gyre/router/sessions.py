"""Sessions: one per execution, each with its calls, its token-exact records and what TITO needs to extend them.

A session only ever sees its own records: every lookup goes through the session token.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from gyre.records import ApiCallRecord, CallRecord


@dataclass(eq=False)
class Turn:
    """A finished chat call that a later request may extend token-exactly.

    Only leaves are kept: once a call extends this one, the history and ids here are dropped (the records keep the
    tokens as deltas), so a session's memory grows with its tokens, not with turns x tokens.
    """

    call_id: str
    raw_messages: list[dict[str, Any]]  # the messages exactly as the client sent them
    tools: list[dict[str, Any]] | None
    reply: dict[str, Any]  # our assistant reply, normalised (what the client must echo back)
    full_ids: list[int]  # input + output: the prefix of any call that extends this one
    ended_with_eos: bool


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

    def remember(self, turn: Turn, extended: Turn | None) -> None:
        """Index a finished call as a leaf; the call it extended stops being one."""
        if extended is not None:
            siblings = self.leaves.get(len(extended.raw_messages), [])
            if extended in siblings:
                siblings.remove(extended)
        self.leaves.setdefault(len(turn.raw_messages), []).append(turn)

    def find_extended(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> Turn | None:
        """The longest leaf call whose messages are a prefix of ``messages`` followed by our reply.

        The prefix is compared as the client sent it (C-speed equality, no re-normalising the history); the reply
        is checked by the caller after restoring tool-call payloads.
        """
        for length in range(len(messages) - 1, 0, -1):
            for turn in reversed(self.leaves.get(length, ())):
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

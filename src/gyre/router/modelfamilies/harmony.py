"""gpt-oss's harmony format: a reply is a run of messages, each a header and a body on a channel.

``<|channel|>analysis<|message|>...<|end|>`` is reasoning; ``final`` (and ``commentary`` with no recipient, a
preamble the user sees) is content; a message to ``functions.NAME`` (``to=`` in the role header or after the
channel) is a tool call whose body is its JSON arguments, ended by ``<|call|>``. Same contract as
`gyre.router.modelfamilies.replyparser.ReplyParser`: fed in any chunks, the deltas add up to the whole parse.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from gyre.router.modelfamilies.replyparser import (
    Delta,
    ParsedReply,
    ToolCall,
    _partial,
    _Stripped,
    _unmark,
)

if TYPE_CHECKING:
    from gyre.router.modelfamilies.registry import BoundFormat

_RECIPIENT = re.compile(r"to=(\S+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")


class HarmonyParser:
    """Parses one harmony reply (the generation prompt has opened ``<|start|>assistant``)."""

    def __init__(
        self,
        fmt: BoundFormat,
        *,
        tools: list[dict[str, Any]] | None = None,
        parse_tools: bool = True,
        offered: Collection[str] | None = None,
        in_reasoning: bool = False,
        call_id: Callable[[str, int], str] | None = None,
    ) -> None:
        self.fmt, self.parse_tools, self.offered = fmt, parse_tools, offered
        self.call_id = call_id or fmt.call_id
        self.m = {t: fmt.mark(t) for t in ("<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|start|>")}
        self.ends = (self.m["<|end|>"], self.m["<|call|>"], self.m["<|return|>"])
        self.pending = ""
        self.header: list[str] = []  # the open message's header so far, in pieces
        self.in_body = False
        self.channel, self.recipient = "", ""
        self.body: list[str] = []  # a call's arguments so far, in pieces
        self.content, self.thinking = _Stripped(), _Stripped()
        self.calls: list[ToolCall] = []
        self.malformed: list[str] = []
        self.unknown: list[str] = []

    def feed(self, text: str) -> list[Delta]:
        """The deltas ``text`` completes."""
        self.pending += text
        out: list[Delta] = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list[Delta]:
        """The deltas left at the end: a message cut short keeps what it had (a cut call is malformed)."""
        out: list[Delta] = []
        while self._step(out, final=True):
            pass
        if self.in_body and self._is_call():
            self._close_call("", out)  # its <|call|> ended the reply (and was taken off), or it was cut
        elif not self.in_body and "".join(self.header).strip():
            self._say(_unmark("".join(self.header), self.fmt.specials), out)
        return out

    def result(self) -> ParsedReply:
        """The whole parse (after `finish`)."""
        return ParsedReply(self.content.value(), [c.openai() for c in self.calls], self.malformed, self.unknown,
                           self.thinking.value())  # fmt: skip

    def _is_call(self) -> bool:
        return self.parse_tools and self.recipient.startswith("functions.")

    def _step(self, out: list[Delta], final: bool) -> bool:
        if not self.in_body:
            at = self.pending.find(self.m["<|message|>"])
            if at < 0:
                keep = 0 if final else _partial(self.pending, (self.m["<|message|>"],))
                self.header.append(self.pending[: len(self.pending) - keep])
                self.pending = self.pending[len(self.pending) - keep :]
                return False
            self.header.append(self.pending[:at])
            self.pending = self.pending[at + len(self.m["<|message|>"]) :]
            plain = _unmark("".join(self.header), ())
            channel = _CHANNEL.search(plain)
            recipient = _RECIPIENT.search(plain)
            self.channel = channel.group(1) if channel else ""
            self.recipient = recipient.group(1) if recipient else ""
            self.in_body, self.body = True, []
            return True
        first, which = len(self.pending), ""
        for end in self.ends:
            at = self.pending.find(end, 0, first + len(end))
            if 0 <= at < first:
                first, which = at, end
        if not which:
            keep = 0 if final else _partial(self.pending, self.ends)
            self._body(self.pending[: len(self.pending) - keep], out)
            self.pending = self.pending[len(self.pending) - keep :]
            return False
        self._body(self.pending[:first], out)
        self.pending = self.pending[first + len(which) :]
        if self._is_call():
            self._close_call(which, out)
        self.in_body, self.header, self.body = False, [], []
        return True

    def _body(self, text: str, out: list[Delta]) -> None:
        if self._is_call():
            self.body.append(text)
        elif self.channel == "analysis":
            if text and (piece := self.thinking.add(_unmark(text, self.fmt.specials))):
                out.append(Delta(reasoning=piece))
        else:
            self._say(text, out)

    def _close_call(self, end: str, out: list[Delta]) -> None:
        from gyre.router.modelfamilies.registry import _object_text

        name = self.recipient[len("functions.") :]
        body = "".join(self.body)
        arguments = _object_text(_unmark(body, ()).strip())
        raw = _unmark("".join(self.header) + self.m["<|message|>"] + body + end, self.fmt.specials)
        if arguments is None or not name:
            self.malformed.append(raw)
            self._say(raw, out)
        elif self.offered is not None and name not in self.offered:
            self.unknown.append(raw)
            self._say(raw, out)
        else:
            call = ToolCall(len(self.calls), self.call_id(name, len(self.calls)), name, arguments)
            self.calls.append(call)
            out.append(Delta(tool_call=call))

    def _say(self, text: str, out: list[Delta]) -> None:
        if text and (piece := self.content.add(_unmark(text, self.fmt.specials))):
            out.append(Delta(content=piece))

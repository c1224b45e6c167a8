"""One reply's text to content, reasoning and tool calls, fed in any chunks: the streaming parser of every family.

The text is *marked*: every added token the model sampled (``<|im_end|>``, ``<think>``, a family's tool markers)
is wrapped as ``MARK_OPEN + text + MARK_CLOSE`` by `gyre.router.modelfamilies.marked.MarkedDecoder`, so a marker that is
one token is matched by that token, never by text that spells it (a user's ``<tool_call>`` echoed by the model).

Invariant (the property tests check it): for every way of cutting the same text into chunks, the deltas `feed` and
`finish` return add up to the same `ParsedReply`, and nothing sent is ever taken back. The whole-reply parse *is*
this parser fed one chunk. Text that may still become a marker is held back; a tool call is sent when its block
is complete and valid; a block that turns out malformed (or calls a function not offered) goes to the content as
the model wrote it, and is listed as such.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from gyre.router.modelfamilies.registry import BoundFormat

MARK_OPEN, MARK_CLOSE = "\ue000", "\ue001"  # around each added token's text in marked text
_MARKED = re.compile(f"{MARK_OPEN}([^{MARK_CLOSE}]*){MARK_CLOSE}")


class ToolCall(msgspec.Struct, frozen=True):
    """One parsed call, in the order the model wrote it; ``arguments`` is a JSON object's text."""

    index: int
    id: str
    name: str
    arguments: str

    def openai(self) -> dict[str, Any]:
        """The call as an OpenAI message's ``tool_calls`` entry."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


class Delta(msgspec.Struct, frozen=True):
    """What one chunk of a reply adds: content text, reasoning text, or one whole tool call."""

    content: str = ""
    reasoning: str = ""
    tool_call: ToolCall | None = None


class Block(msgspec.Struct, frozen=True):
    """A tool-call block as it appears in marked text, and the function reading its body.

    ``close`` None: the block runs to the next ``open`` or the end of the reply. ``read(body, schemas)`` returns the
    block's calls as (name, arguments JSON text, id or None), or None when the body is malformed."""

    open: str
    close: str | None
    read: Callable[[str, dict[str, Any]], list[tuple[str, str, str | None]] | None]


class ParsedReply(msgspec.Struct):
    """A whole reply, parsed: what the chat message returns and what was not a valid call."""

    content: str  # text outside valid calls and reasoning, stripped; malformed or unknown blocks stay in it
    tool_calls: list[dict[str, Any]]  # OpenAI form
    malformed: list[str] = msgspec.field(default_factory=list)  # raw text of each block that did not parse
    unknown: list[str] = msgspec.field(
        default_factory=list
    )  # raw text of each call to a function not offered
    reasoning: str = ""  # the reply's reasoning text, stripped

    def message(self) -> dict[str, Any]:
        """The assistant message a client sends back when it continues the conversation."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        return out


class _Stripped:
    """A text stream with leading whitespace dropped and trailing whitespace held: the deltas add up to
    ``"".join(pieces).strip()``."""

    def __init__(self) -> None:
        self.started = False
        self.held: list[str] = []  # whitespace since the last text, in pieces
        self.text: list[str] = []

    def add(self, piece: str) -> str:
        if not self.started:
            piece = piece.lstrip()
            if not piece:
                return ""
            self.started = True
        body = piece.rstrip()
        if not body:
            self.held.append(piece)
            return ""
        out = "".join(self.held) + body
        self.held = [piece[len(body) :]]
        self.text.append(out)
        return out

    def value(self) -> str:
        return "".join(self.text)


class ReplyParser:
    """Parses one reply fed in chunks of marked text (`feed`), then `finish`; `result` is the whole parse."""

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
        self.fmt = fmt
        self.schemas = _schemas(tools)
        self.blocks = fmt.blocks if parse_tools else ()
        self.offered = offered
        self.call_id = call_id or fmt.call_id
        self.state = "reasoning" if in_reasoning and fmt.reasoning is not None else "content"
        self.reasoning_done = fmt.reasoning is None or self.state == "reasoning"  # no opening expected
        self.pending = ""
        self.block: Block | None = None
        self.block_text: list[
            str
        ] = []  # the open block's text so far, its opening marker included, in pieces
        self.opened = ""  # the marker that opened it ("" for a bare JSON call)
        self.content, self.thinking = _Stripped(), _Stripped()
        self.calls: list[ToolCall] = []
        self.malformed: list[str] = []
        self.unknown: list[str] = []
        self.finished = False

    # ---- feeding ----------------------------------------------------------------------------------------------
    def feed(self, text: str) -> list[Delta]:
        """The deltas ``text`` (the next piece of the reply's marked text) completes."""
        self.pending += text
        out: list[Delta] = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list[Delta]:
        """The deltas left once the reply has ended: held text, an unterminated block as malformed content."""
        out: list[Delta] = []
        while self._step(out, final=True):
            pass
        if self.block is not None:
            self._close_block("".join(self.block_text), out, complete=self.block.close is None)
        self.finished = True
        return out

    def result(self) -> ParsedReply:
        """The whole parse (after `finish`)."""
        return ParsedReply(
            content=self.content.value(),
            tool_calls=[c.openai() for c in self.calls],
            malformed=self.malformed,
            unknown=self.unknown,
            reasoning=self.thinking.value(),
        )

    def _step(self, out: list[Delta], final: bool) -> bool:
        """Consume what can be decided of ``pending``; whether to look again."""
        if self.state == "reasoning":
            assert self.fmt.reasoning is not None
            close = self.fmt.reasoning[1]
            at = self.pending.find(close)
            if at < 0:
                keep = 0 if final else _partial(self.pending, (close,))
                self._reason(self.pending[: len(self.pending) - keep], out)
                self.pending = self.pending[len(self.pending) - keep :]
                return False
            self._reason(self.pending[:at], out)
            self.pending = self.pending[at + len(close) :]
            self.state = "content"
            return True
        if self.block is not None:
            return self._step_block(out, final)
        if not self.reasoning_done:  # reasoning opens the reply (after whitespace) or not at all
            assert self.fmt.reasoning is not None
            opening, head = self.fmt.reasoning[0], self.pending.lstrip()
            if head.startswith(opening):
                self.pending = head[len(opening) :]
                self.state, self.reasoning_done = "reasoning", True
                return True
            if not final and opening.startswith(head):
                return False  # may still open it
            self.reasoning_done = True
        if (
            self.fmt.json_at_start
            and self.blocks
            and not self.content.started
            and not self.calls
            and _lead(self.pending, self.fmt.specials).startswith("{")
        ):  # Llama-3's bare JSON call: the reply is a call when it opens with an object
            self.block, self.block_text, self.opened = self.blocks[0], [], ""
            self.pending = _lead(self.pending, self.fmt.specials)  # the block's body, read as any block's
            return True
        # content: up to the next tool block
        patterns = [(b.open, b) for b in self.blocks]
        first, found = len(self.pending), None  # type: int, tuple[str, Block] | None
        for pattern, block in patterns:
            at = self.pending.find(pattern, 0, first + len(pattern))
            if 0 <= at < first:
                first, found = at, (pattern, block)
        if found is None:
            keep = 0 if final else _partial(self.pending, [p for p, _ in patterns])
            if not final and self.fmt.json_at_start and self.blocks and not self.content.started:
                keep = len(self.pending) if not _lead(self.pending, self.fmt.specials) else keep
            self._say(self.pending[: len(self.pending) - keep], out)
            self.pending = self.pending[len(self.pending) - keep :]
            return False
        pattern, block = found
        self._say(self.pending[:first], out)
        self.pending = self.pending[first + len(pattern) :]
        self.block, self.block_text, self.opened = block, [pattern], pattern
        return True

    def _step_block(self, out: list[Delta], final: bool) -> bool:
        block = self.block
        assert block is not None
        ends = [block.open] + ([block.close] if block.close else [])
        first, which = len(self.pending), ""
        for pattern in ends:
            at = self.pending.find(pattern, 0, first + len(pattern))
            if 0 <= at < first:
                first, which = at, pattern
        if not which:
            keep = 0 if final else _partial(self.pending, ends)
            self.block_text.append(self.pending[: len(self.pending) - keep])
            self.pending = self.pending[len(self.pending) - keep :]
            return False
        if which == block.close:
            self.block_text.append(self.pending[: first + len(which)])
            self.pending = self.pending[first + len(which) :]
            self._close_block("".join(self.block_text), out, complete=True)
        else:  # the next block opens first: this one ends here (unterminated, unless it needs no close)
            self.block_text.append(self.pending[:first])
            self.pending = self.pending[first:]
            self._close_block("".join(self.block_text), out, complete=block.close is None)
        return True

    def _close_block(self, text: str, out: list[Delta], complete: bool) -> None:
        block = self.block
        assert block is not None
        self.block, self.block_text = None, []
        body = text[len(self.opened) :]
        if block.close and complete:
            body = body[: len(body) - len(block.close)]
        calls = block.read(body, self.schemas) if complete else None
        raw = _unmark(text, self.fmt.specials)
        if not calls:
            self.malformed.append(raw)
            self._say(text, out)
            return
        if self.offered is not None and any(name not in self.offered for name, _, _ in calls):
            self.unknown.append(raw)
            self._say(text, out)
            return
        for name, arguments, given_id in calls:
            index = len(self.calls)
            call = ToolCall(index, given_id or self.call_id(name, index), name, arguments)
            self.calls.append(call)
            out.append(Delta(tool_call=call))

    def _say(self, text: str, out: list[Delta]) -> None:
        if text and (piece := self.content.add(_unmark(text, self.fmt.specials))):
            out.append(Delta(content=piece))

    def _reason(self, text: str, out: list[Delta]) -> None:
        if text and (piece := self.thinking.add(_unmark(text, self.fmt.specials))):
            out.append(Delta(reasoning=piece))


def _partial(text: str, patterns: Collection[str]) -> int:
    """The length of the longest tail of ``text`` that is a proper prefix of a pattern (it may become one)."""
    longest = 0
    for pattern in patterns:
        for k in range(min(len(pattern) - 1, len(text)), longest, -1):
            if text.endswith(pattern[:k]):
                longest = k
                break
    return longest


def _lead(text: str, specials: Collection[str]) -> str:
    """``text`` without the whitespace and special tokens it opens with (text that is no content)."""
    while True:
        text = text.lstrip()
        if (
            not text.startswith(MARK_OPEN)
            or (end := text.find(MARK_CLOSE)) < 0
            or text[1:end] not in specials
        ):
            return text
        text = text[end + 1 :]


def _unmark(text: str, specials: Collection[str]) -> str:
    """Marked text as plain text: special tokens dropped (as ``skip_special_tokens``), other added tokens kept."""
    if MARK_OPEN not in text:
        return text
    return _MARKED.sub(lambda m: "" if m.group(1) in specials else m.group(1), text)


def _schemas(tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Offered functions' parameter schemas by name (for families whose arguments are untyped text)."""
    out: dict[str, Any] = {}
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            out[function["name"]] = function.get("parameters")
    return out

"""The model families: how each writes tool calls and reasoning, ends a turn, and wants its history.

A `ModelFormat` is pure data and functions of text; `ModelFormat.bind` fits it to a tokenizer (each marker that is
one token in it is matched only as that token, see `gyre.router.modelfamilies.replyparser`). Names are SGLang's
(``--tool-call-parser`` and ``--reasoning-parser``), so a deployment's flags carry over. The readers follow the
published formats of each family (the model cards, SGLang's detectors, the chat templates); nothing the model wrote
is dropped: a block that does not read is malformed and stays in the content.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from gyre.router.modelfamilies.replyparser import MARK_CLOSE, MARK_OPEN, Block

Read = Callable[[str, dict[str, Any]], list[tuple[str, str, str | None]] | None]
_MISSING = object()


@dataclass(frozen=True)
class RawBlock:
    """A tool-call block as the family writes it, markers as plain text."""

    open: str
    close: str | None
    read: Read


@dataclass(frozen=True)
class ModelFormat:
    """One family's output and history conventions."""

    name: str  # SGLang's tool-call parser name
    blocks: tuple[RawBlock, ...]
    reasoning: tuple[str, str] | None = None  # reasoning opening and closing marker
    reasoning_parser: str | None = None  # SGLang's reasoning parser name
    terminators: tuple[str, ...] = ()  # texts of tokens that end an assistant turn (the last id it samples)
    # texts of tokens that end a turn by opening the next one (GLM's <|observation|>)
    openers: tuple[str, ...] = ()
    # tokens the template ends earlier turns with in place of the terminator sampled (gpt-oss's <|end|>)
    history_ends: tuple[str, ...] = ()
    json_at_start: bool = False  # a reply opening with a JSON object is a call (Llama 3)
    history_arguments: Literal["string", "object"] = (
        "object"  # what the template wants in tool_calls[].arguments
    )
    reasoning_field: str = "reasoning_content"  # the assistant message key the template reads reasoning from
    call_ids: Literal["openai", "mistral", "kimi"] = "openai"
    custom: str = ""  # a parser of its own (harmony) instead of blocks

    def bind(self, added: dict[int, str], specials: frozenset[str], eos: str) -> BoundFormat:
        """This format for a tokenizer with ``added`` tokens (id -> text), of which ``specials`` are special."""
        texts = set(added.values())

        def mark(text: str) -> str:
            return f"{MARK_OPEN}{text}{MARK_CLOSE}" if text in texts else text

        blocks = tuple(Block(mark(b.open), mark(b.close) if b.close else None, _marked_read(b.read, texts))
                       for b in self.blocks)  # fmt: skip
        reasoning = (mark(self.reasoning[0]), mark(self.reasoning[1])) if self.reasoning else None
        ends = {t for t in (*self.terminators, eos) if t in texts}
        ids = {text: i for i, text in added.items()}
        closing = (ends | {t for t in self.history_ends if t in texts}) - set(self.openers)
        return BoundFormat(
            fmt=self,
            blocks=blocks,
            reasoning=reasoning,
            specials=specials,
            terminator_ids=frozenset(ids[t] for t in ends | {o for o in self.openers if o in texts}),
            closing_texts=tuple(sorted(closing, key=len, reverse=True)),
            opening_texts=tuple(o for o in self.openers if o in texts),
            json_at_start=self.json_at_start,
            added=frozenset(texts),
        )

    def call_id(self, name: str, index: int) -> str:
        """A new id for the ``index``-th call of a reply, in the form the family's template accepts."""
        if self.call_ids == "mistral":
            return uuid.uuid4().hex[:9]
        if self.call_ids == "kimi":
            return f"functions.{name}:{index}"
        return "call_" + uuid.uuid4().hex[:24]

    def history_call_id(self, call_id: str) -> str:
        """A client's tool-call id as the template accepts it (Mistral: 9 alphanumerics; stable per id)."""
        if self.call_ids == "mistral" and not re.fullmatch(r"[A-Za-z0-9]{9}", call_id):
            return hashlib.blake2b(call_id.encode(), digest_size=8).hexdigest()[:9]
        return call_id


@dataclass(frozen=True)
class BoundFormat:
    """A format fitted to one tokenizer: markers as they appear in its marked text, its terminator ids."""

    fmt: ModelFormat
    blocks: tuple[Block, ...]
    reasoning: tuple[str, str] | None
    specials: frozenset[str]
    terminator_ids: frozenset[int]  # ids that end an assistant turn, the tokenizer's eos included
    closing_texts: tuple[str, ...]  # terminators that close a turn, longest first
    opening_texts: tuple[str, ...]  # terminators that open the next turn
    json_at_start: bool = False
    added: frozenset[str] = frozenset()  # texts of the tokenizer's added tokens

    @property
    def name(self) -> str:
        """SGLang's tool-call parser name of the family."""
        return self.fmt.name

    def call_id(self, name: str, index: int) -> str:
        """A new id for the ``index``-th call of a reply."""
        return self.fmt.call_id(name, index)

    def mark(self, text: str) -> str:
        """``text`` as it appears in marked text: wrapped when it is one added token."""
        return f"{MARK_OPEN}{text}{MARK_CLOSE}" if text in self.added else text

    def parser(self, **options: Any) -> Any:
        """A new parser for one reply (`ReplyParser`'s options); harmony's for gpt-oss."""
        if self.fmt.custom == "harmony":
            from gyre.router.modelfamilies.harmony import HarmonyParser

            return HarmonyParser(self, **options)
        from gyre.router.modelfamilies.replyparser import ReplyParser

        return ReplyParser(self, **options)


def _marked_read(read: Read, texts: set[str]) -> Read:
    """``read`` over a body whose markers are marked: they are unmarked first (the body is inside one block)."""

    def unmarked(body: str, schemas: dict[str, Any]) -> list[tuple[str, str, str | None]] | None:
        if MARK_OPEN in body:
            body = re.sub(f"{MARK_OPEN}([^{MARK_CLOSE}]*){MARK_CLOSE}", lambda m: m.group(1), body)
        return read(body, schemas)

    return unmarked


# ---- readers ---------------------------------------------------------------------------------------------------
def _object_text(value: Any) -> str | None:
    """Arguments as a JSON object's text: an object, a string holding one (kept as written), None/missing -> {}."""
    if value is _MISSING or value is None:
        return "{}"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, str):
        try:
            return value if isinstance(json.loads(value), dict) else None
        except (ValueError, RecursionError):
            return None
    return None


def _json_call(
    obj: Any, arguments_keys: tuple[str, ...] = ("arguments", "parameters")
) -> tuple[str, str] | None:
    """(name, arguments) of ``{"name": ..., "arguments" | "parameters": {...}}``; both keys given must agree."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    values = [obj.get(k, _MISSING) for k in arguments_keys]
    given = [v for v in values if v is not _MISSING]
    if len(given) > 1 and any(v != given[0] for v in given):
        return None  # two different argument sets: which one the model meant is not ours to guess
    arguments = _object_text(given[0] if given else _MISSING)
    return None if arguments is None else (obj["name"], arguments)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # JSONDecodeError, lone surrogates, nesting past ~1000
        return _MISSING


def read_hermes(body: str, schemas: dict[str, Any]) -> list[tuple[str, str, str | None]] | None:
    """``{"name": ..., "arguments": {...}}`` (Hermes, Qwen2.5, Qwen3)."""
    call = _json_call(_loads(body))
    return None if call is None else [(*call, None)]


def _typed(value: str, name: str, key: str, schemas: dict[str, Any]) -> Any:
    """An untyped parameter value as its schema's type: strings stay text, anything else is read as JSON if it can."""
    schema = schemas.get(name) if isinstance(schemas.get(name), dict) else None
    props = schema.get("properties") if isinstance(schema, dict) else None
    kind = (
        props.get(key, {}).get("type")
        if isinstance(props, dict) and isinstance(props.get(key), dict)
        else None
    )
    if kind == "string":
        return value
    parsed = _loads(value)
    return value if parsed is _MISSING else parsed


_CODER_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.S)
_CODER_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def read_qwen3_coder(body: str, schemas: dict[str, Any]) -> list[tuple[str, str, str | None]] | None:
    """``<function=NAME><parameter=KEY>VALUE</parameter>...</function>`` (Qwen3-Coder's XML form)."""
    match = _CODER_FUNCTION.fullmatch(body)
    if match is None:
        return None
    name, inner = match.group(1).strip(), match.group(2)
    arguments: dict[str, Any] = {}
    for key, value in _CODER_PARAMETER.findall(inner):
        if "<parameter=" in value:
            return None  # an unclosed parameter ran into the next
        arguments[key.strip()] = _typed(value, name, key.strip(), schemas)
    if _CODER_PARAMETER.sub("", inner).strip():
        return None  # text outside the parameters: not this format
    return [(name, json.dumps(arguments, ensure_ascii=False), None)]


_GLM_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def read_glm45(body: str, schemas: dict[str, Any]) -> list[tuple[str, str, str | None]] | None:
    """``NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>...`` (GLM-4.5, GLM-4.6)."""
    head, _, rest = body.partition("<arg_key>")
    name = head.strip()
    if not name or "\n" in name or "<" in name:
        return None
    rest = "<arg_key>" + rest if rest else ""
    pairs = _GLM_PAIR.findall(rest)
    if any("<arg_key>" in v or "<arg_value>" in v for _, v in pairs):
        return None  # an unclosed value ran into the next pair
    arguments = {k.strip(): _typed(v, name, k.strip(), schemas) for k, v in pairs}
    if _GLM_PAIR.sub("", rest).strip():
        return None
    return [(name, json.dumps(arguments, ensure_ascii=False), None)]


_KIMI_CALL = re.compile(
    r"\s*<\|tool_call_begin\|>\s*([^<]+?)\s*<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>\s*", re.S
)


def read_kimi_k2(body: str, schemas: dict[str, Any]) -> list[tuple[str, str, str | None]] | None:
    """``<|tool_call_begin|>functions.NAME:i<|tool_call_argument_begin|>{...}<|tool_call_end|>``, one or more."""
    calls: list[tuple[str, str, str | None]] = []
    at = 0
    for match in _KIMI_CALL.finditer(body):
        if match.start() != at:
            return None
        at = match.end()
        call_id, arguments = match.group(1), _object_text(match.group(2).strip())
        name = re.fullmatch(r"(?:functions\.)?(.+?)(?::\d+)?", call_id)
        if arguments is None or name is None:
            return None
        calls.append((name.group(1), arguments, call_id))
    return calls if calls and at == len(body) else None


_DS_CALL = re.compile(r"\s*<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>\s*", re.S)
_DS_V3_ARGS = re.compile(r"\s*(\S+)\s*```json\s*(.*?)\s*```\s*", re.S)


def _read_deepseek(body: str, v3: bool) -> list[tuple[str, str, str | None]] | None:
    calls: list[tuple[str, str, str | None]] = []
    at = 0
    for match in _DS_CALL.finditer(body):
        if match.start() != at:
            return None
        at = match.end()
        head, rest = match.group(1).strip(), match.group(2)
        if v3:  # function<｜tool▁sep｜>NAME\n```json\n{...}\n```
            inner = _DS_V3_ARGS.fullmatch(rest)
            if head != "function" or inner is None:
                return None
            name, arguments = inner.group(1), _object_text(inner.group(2))
        else:  # NAME<｜tool▁sep｜>{...}
            name, arguments = head, _object_text(rest.strip())
        if not name or arguments is None:
            return None
        calls.append((name, arguments, None))
    return calls if calls and at == len(body) else None


def read_deepseekv3(body: str, schemas: dict[str, Any]) -> list[tuple[str, str, str | None]] | None:
    """DeepSeek-V3's calls section (fenced JSON arguments)."""
    return _read_deepseek(body, v3=True)


def read_deepseekv31(body: str, schemas: dict[str, Any]) -> list[tuple[str, str, str | None]] | None:
    """DeepSeek-V3.1's calls section (``NAME<｜tool▁sep｜>{...}``)."""
    return _read_deepseek(body, v3=False)


def read_llama3(body: str, schemas: dict[str, Any]) -> list[tuple[str, str, str | None]] | None:
    """``{"name": ..., "parameters": {...}}``, several separated by ``;`` (Llama 3.x JSON tool calling)."""
    body = body.strip()
    decoder = json.JSONDecoder()
    calls: list[tuple[str, str, str | None]] = []
    at = 0
    while at < len(body):
        try:
            obj, end = decoder.raw_decode(body, at)
        except (ValueError, RecursionError):
            return None
        call = _json_call(obj, ("parameters", "arguments"))
        if call is None:
            return None
        calls.append((*call, None))
        at = end
        while at < len(body) and body[at] in " \t\n;":
            at += 1
    return calls or None


_MISTRAL_ARGS = re.compile(r"\s*([A-Za-z0-9_.\-]+)\s*\[ARGS\](.*)", re.S)


def read_mistral(body: str, schemas: dict[str, Any]) -> list[tuple[str, str, str | None]] | None:
    """``[{"name": ..., "arguments": {...}, "id": ...}, ...]`` (Mistral, Nemo) or ``NAME[ARGS]{...}`` (Small 3.2)."""
    named = _MISTRAL_ARGS.fullmatch(body)
    if named is not None:
        arguments = _object_text(named.group(2).strip())
        return None if arguments is None else [(named.group(1), arguments, None)]
    items = _loads(body.strip())
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list) or not items:
        return None
    calls: list[tuple[str, str, str | None]] = []
    for item in items:
        call = _json_call(item)
        if call is None:
            return None
        given = item.get("id")
        calls.append(
            (*call, given if isinstance(given, str) and re.fullmatch(r"[A-Za-z0-9]{9}", given) else None)
        )
    return calls


# ---- the registry ----------------------------------------------------------------------------------------------
_THINK = ("<think>", "</think>")
_QWEN_ENDS = ("<|im_end|>", "<|endoftext|>")
_DS_SECTION = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
HERMES = ModelFormat(
    name="hermes",
    blocks=(RawBlock("<tool_call>", "</tool_call>", read_hermes),),
    reasoning=_THINK,
    reasoning_parser="qwen3",
    terminators=_QWEN_ENDS,
)
FORMATS: dict[str, ModelFormat] = {
    "hermes": HERMES,
    "qwen25": HERMES,
    "qwen": HERMES,
    "qwen3_coder": ModelFormat(
        name="qwen3_coder",
        blocks=(RawBlock("<tool_call>", "</tool_call>", read_qwen3_coder),),
        reasoning=_THINK,
        reasoning_parser="qwen3",
        terminators=_QWEN_ENDS,
    ),
    "glm45": ModelFormat(
        name="glm45",
        blocks=(RawBlock("<tool_call>", "</tool_call>", read_glm45),),
        reasoning=_THINK,
        reasoning_parser="glm45",
        terminators=("<|endoftext|>",),
        openers=("<|observation|>", "<|user|>"),  # GLM stops at the token that opens the next turn
    ),
    "kimi_k2": ModelFormat(
        name="kimi_k2",
        blocks=(RawBlock("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", read_kimi_k2),),
        reasoning=_THINK,
        reasoning_parser="kimi_k2",
        terminators=("<|im_end|>", "[EOS]"),
        call_ids="kimi",
    ),
    "deepseekv3": ModelFormat(
        name="deepseekv3",
        blocks=(RawBlock(*_DS_SECTION, read_deepseekv3),),
        reasoning=_THINK,
        reasoning_parser="deepseek-r1",
        terminators=("<｜end▁of▁sentence｜>",),
    ),
    "deepseekv31": ModelFormat(
        name="deepseekv31",
        blocks=(RawBlock(*_DS_SECTION, read_deepseekv31),),
        reasoning=_THINK,
        reasoning_parser="deepseek-v3",
        terminators=("<｜end▁of▁sentence｜>",),
    ),
    "llama3": ModelFormat(
        name="llama3",
        blocks=(RawBlock("<|python_tag|>", None, read_llama3),),
        terminators=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
        json_at_start=True,
    ),
    "mistral": ModelFormat(
        name="mistral",
        blocks=(RawBlock("[TOOL_CALLS]", None, read_mistral),),
        reasoning=("[THINK]", "[/THINK]"),
        reasoning_parser="mistral",
        terminators=("</s>",),
        call_ids="mistral",
    ),
    "gpt-oss": ModelFormat(
        name="gpt-oss",
        blocks=(),
        reasoning_parser="gpt-oss",
        terminators=("<|return|>", "<|call|>"),
        history_ends=("<|end|>",),  # a final answer's <|return|> is <|end|> once more turns follow
        reasoning_field="thinking",
        custom="harmony",
    ),
}


def detect(template: str) -> str | None:
    """The format a chat template's tool markup belongs to; None when it renders no tool calls at all.

    Raises ``LookupError`` for a template with tool markup no format claims."""
    if "<|channel|>" in template and "<|message|>" in template:
        return "gpt-oss"
    if "<|tool_calls_section_begin|>" in template:
        return "kimi_k2"
    if "tool▁calls▁begin" in template:
        return "deepseekv3" if "```json" in template else "deepseekv31"
    if "<arg_key>" in template:
        return "glm45"
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_coder"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template or ("<|start_header_id|>" in template and "tool" in template):
        return "llama3"
    if re.search(r"tool_calls|\btools\b", template):
        raise LookupError("the chat template renders tool calls in a form no model format claims")
    return None

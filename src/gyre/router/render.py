"""Chat messages to token ids with the model's own chat template, and sampled ids back to an assistant reply.

The router never re-tokenizes what the model produced (TITO, DESIGN.md section 5): when a request extends an
earlier call, its input ids are the earlier input ids + the sampled output ids + ``render_extension`` of only the
new messages. ``message_digests`` identifies message prefixes so the router can find the call a request extends.
Every malformed message raises ``ValueError`` naming its index and field; the caller answers HTTP 400.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import msgspec

from gyre.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ROLES = ("system", "user", "assistant", "tool")
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

# The conversation render_extension puts before the new messages; the reply text marks the assistant turn.
_DUMMY_REPLY = "gyre-dummy-reply"
_DUMMY_PREFIX = (
    {"role": "system", "content": "gyre-dummy-system"},
    {"role": "user", "content": "gyre-dummy-user"},
    {"role": "assistant", "content": _DUMMY_REPLY},
)
_PREFIX_CACHE_ENTRIES = 64  # distinct tool lists whose dummy-prefix render is kept


def normalize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The canonical form of OpenAI chat messages, used both to render and to match requests.

    Keeps ``role``, ``content`` (always a string), ``name``, an assistant's non-empty ``tool_calls`` (arguments as
    a JSON string) and a tool message's ``tool_call_id``; drops every other key. ``developer`` becomes ``system``.
    Normalizing a normalized list returns an equal list.
    """
    if not isinstance(messages, list):
        raise ValueError(f"messages must be a list of message objects, got {type(messages).__name__}")
    return [_normalize_message(i, message) for i, message in enumerate(messages)]


def _normalize_message(index: int, message: Any) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise ValueError(f"{where} must be an object, got {type(message).__name__}")
    role = message.get("role")
    if role == "developer":
        role = "system"  # OpenAI's newer name for the system role; chat templates know only "system"
    if role not in ROLES:
        raise ValueError(f"{where}.role must be one of {', '.join(ROLES)} (or developer), got {role!r}")
    if role != "assistant" and "content" not in message:
        raise ValueError(f"{where}.content is missing; a {role} message needs content")
    out: dict[str, Any] = {"role": role, "content": _content_text(where, message.get("content"))}
    if "name" in message and message["name"] is not None:
        if not isinstance(message["name"], str):
            raise ValueError(f"{where}.name must be a string, got {type(message['name']).__name__}")
        out["name"] = message["name"]
    if role == "assistant":
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise ValueError(f"{where}.tool_calls must be a list, got {type(calls).__name__}")
        if calls:
            out["tool_calls"] = [
                _normalize_tool_call(f"{where}.tool_calls[{j}]", c) for j, c in enumerate(calls)
            ]
    elif role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise ValueError(
                f"{where}.tool_call_id must be the id of the tool call it answers, got {call_id!r}"
            )
        out["tool_call_id"] = call_id
    return out


def _content_text(where: str, content: Any) -> str:
    """OpenAI content (a string, None, or a list of text parts) as one string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(
            f"{where}.content must be a string, null or a list of parts, got {type(content).__name__}"
        )
    texts: list[str] = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ValueError(f"{where}.content[{k}] must be a text part {{'type': 'text', 'text': str}}")
        texts.append(part["text"])
    return "".join(texts)


def _normalize_tool_call(where: str, call: Any) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise ValueError(f"{where} must be an object, got {type(call).__name__}")
    if call.get("type", "function") != "function":
        raise ValueError(f"{where}.type must be 'function', got {call.get('type')!r}")
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise ValueError(f"{where}.id must be a non-empty string, got {call_id!r}")
    function = call.get("function")
    if not isinstance(function, dict):
        raise ValueError(f"{where}.function must be an object with name and arguments")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.function.name must be a non-empty string, got {name!r}")
    arguments = function.get("arguments")
    if arguments is None:
        arguments = "{}"
    elif isinstance(arguments, dict):
        arguments = json.dumps(arguments, ensure_ascii=False)
    elif not isinstance(arguments, str):
        raise ValueError(f"{where}.function.arguments must be a JSON string or an object, got {arguments!r}")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def message_digests(messages: list[dict[str, Any]]) -> list[bytes]:
    """Prefix-chain digests: element ``k`` identifies the first ``k + 1`` normalized messages."""
    digests: list[bytes] = []
    previous = b""
    for message in normalize_messages(messages):
        previous = _chain(previous, message)
        digests.append(previous)
    return digests


def chain_digest(previous: bytes, message: dict[str, Any]) -> bytes:
    """Extend a digest chain by one message: ``chain_digest(d[k], m) == message_digests(ms + [m])[k + 1]``."""
    return _chain(previous, normalize_messages([message])[0])


def _chain(previous: bytes, normalized: dict[str, Any]) -> bytes:
    encoded = msgspec.json.encode(normalized, order="sorted")
    return hashlib.blake2b(previous + encoded, digest_size=16, person=b"gyre-messages").digest()


class ParsedReply(msgspec.Struct):
    """An assistant reply decoded from sampled ids: text, OpenAI tool calls, and the blocks that failed to parse."""

    content: str  # text outside well-formed tool-call blocks, stripped; malformed blocks stay in it
    tool_calls: list[dict[str, Any]]  # OpenAI form; function.arguments is a JSON string
    malformed: list[str]  # raw text of each tool-call block that did not parse

    def message(self) -> dict[str, Any]:
        """The assistant message a client sends back when it continues the conversation."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


class ChatRenderer:
    """Renders chat messages with a tokenizer's chat template and parses the model's replies."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        eos = tokenizer.eos_token
        if not isinstance(eos, str) or not eos or tokenizer.eos_token_id is None:
            raise ConfigError(
                "the tokenizer has no eos token; set eos_token in the model's tokenizer_config.json"
            )
        if not tokenizer.chat_template:
            raise ConfigError(
                "the tokenizer has no chat template; set chat_template in tokenizer_config.json"
            )
        if tokenizer.encode(eos, add_special_tokens=False) != [tokenizer.eos_token_id]:
            raise ConfigError(f"the eos text {eos!r} does not encode to the single eos token id")
        self._tokenizer = tokenizer
        self._eos_text: str = eos
        self._eos_id: int = int(tokenizer.eos_token_id)
        self._prefix_cache: dict[str, str] = {}  # tools key -> dummy prefix text up to its reply's eos marker

    @classmethod
    def from_model_dir(cls, path: str | Path) -> ChatRenderer:
        """A renderer for the tokenizer saved in a local model directory."""
        from gyre.models import load_tokenizer

        return cls(load_tokenizer(path))

    @property
    def eos_text(self) -> str:
        """The text of the token that ends an assistant turn."""
        return self._eos_text

    @property
    def eos_token_id(self) -> int:
        """The id of the token that ends an assistant turn."""
        return self._eos_id

    def render_full(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Ids of the whole conversation followed by the generation prompt."""
        text = self._template(normalize_messages(messages), tools, add_generation_prompt=True)
        return self._encode(text)

    def render_extension(
        self,
        new_messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        previous_ended_with_eos: bool = True,
    ) -> list[int]:
        """Ids of only ``new_messages`` as they follow an assistant turn, ending with the generation prompt.

        Equal to what ``render_full`` gives after the assistant turn's eos marker. When the previous reply did not
        end with the eos token (stopped by length or a stop string), the eos token is prepended: it is context now.
        Raises ``ValueError`` if the template renders earlier turns differently once new messages follow; the
        caller then renders the whole conversation as a new branch.
        """
        new = normalize_messages(new_messages)
        prefix = self._dummy_prefix(tools)
        text = self._template([*_DUMMY_PREFIX, *new], tools, add_generation_prompt=True)
        if not text.startswith(prefix):
            raise ValueError("the chat template renders earlier turns differently once new messages follow")
        delta = text[len(prefix) :]
        if not previous_ended_with_eos:
            delta = self._eos_text + delta
        return self._encode(delta)

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text (no template, no special tokens added)."""
        return self._encode(text)

    def decode(self, ids: list[int]) -> str:
        """Text of token ids, special tokens included (for logprob entries and completions)."""
        return str(self._tokenizer.decode(ids, skip_special_tokens=False))

    def parse_output(self, output_ids: list[int]) -> ParsedReply:
        """Decode sampled ids into content and Hermes-style ``<tool_call>`` tool calls; never raises on bad output."""
        ids = list(output_ids)
        if ids and ids[-1] == self._eos_id:
            ids.pop()
        text = self._tokenizer.decode(ids, skip_special_tokens=True)
        if not isinstance(text, str):
            raise TypeError(f"decode returned {type(text).__name__}, not str")
        return parse_tool_calls(text)

    def _dummy_prefix(self, tools: list[dict[str, Any]] | None) -> str:
        """The dummy conversation's text up to and including its assistant reply's eos marker."""
        key = json.dumps(tools, sort_keys=True, ensure_ascii=False)
        cached = self._prefix_cache.get(key)
        if cached is not None:
            return cached
        text = self._template(list(_DUMMY_PREFIX), tools, add_generation_prompt=False)
        end, reply_at = text.rfind(self._eos_text), text.rfind(_DUMMY_REPLY)
        if reply_at < 0 or end < reply_at:
            raise ValueError(
                f"the chat template does not end an assistant turn with the eos text {self._eos_text!r}"
            )
        prefix = text[: end + len(self._eos_text)]
        if len(self._prefix_cache) >= _PREFIX_CACHE_ENTRIES:
            self._prefix_cache.pop(next(iter(self._prefix_cache)))  # oldest first
        self._prefix_cache[key] = prefix
        return prefix

    def _template(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> str:
        if tools is not None and not isinstance(tools, list):
            raise ValueError(f"tools must be a list of tool objects, got {type(tools).__name__}")
        schemas: list[Any] | None = tools  # passed through unchanged, as OpenAI clients send them
        try:
            text = self._tokenizer.apply_chat_template(
                messages, tools=schemas, add_generation_prompt=add_generation_prompt, tokenize=False
            )
        except (
            jinja2.TemplateError,
            TypeError,
            ValueError,
        ) as error:  # raise_exception() gives TemplateError
            raise ValueError(f"the chat template could not render these messages: {error}") from error
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
        return text

    def _encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))


_ARGUMENTS_MISSING = object()


def parse_tool_calls(text: str) -> ParsedReply:
    """Split decoded reply text into content and ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` calls.

    A block that is unterminated (no closing tag before the next opening one or the end) or whose JSON does not
    parse into a name and object or string arguments is listed in ``malformed`` and kept in ``content``.
    """
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    malformed: list[str] = []
    pos = 0
    while (start := text.find(TOOL_CALL_OPEN, pos)) >= 0:
        content.append(text[pos:start])
        body = start + len(TOOL_CALL_OPEN)
        close = text.find(TOOL_CALL_CLOSE, body)
        reopen = text.find(TOOL_CALL_OPEN, body)
        if (
            close < 0 or 0 <= reopen < close
        ):  # unterminated: the block runs to the next opening tag or the end
            end = reopen if reopen >= 0 else len(text)
            call = None
        else:
            end = close + len(TOOL_CALL_CLOSE)
            call = _parse_call(text[body:close])
        if call is None:
            malformed.append(text[start:end])
            content.append(text[start:end])
        else:
            calls.append(call)
        pos = end
    content.append(text[pos:])
    return ParsedReply(content="".join(content).strip(), tool_calls=calls, malformed=malformed)


def _parse_call(body: str) -> dict[str, Any] | None:
    """One tool call in OpenAI form from a block's JSON, or None if it is not a valid call."""
    try:
        obj = json.loads(body)
    except ValueError:  # json.JSONDecodeError, and UnicodeError subclasses for lone surrogates
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get("arguments", _ARGUMENTS_MISSING)
    if arguments is _ARGUMENTS_MISSING or arguments is None:
        arguments = "{}"
    elif isinstance(arguments, dict):
        arguments = json.dumps(arguments, ensure_ascii=False)
    elif not isinstance(arguments, str):
        return None
    call_id = "call_" + uuid.uuid4().hex[:24]
    return {"id": call_id, "type": "function", "function": {"name": obj["name"], "arguments": arguments}}

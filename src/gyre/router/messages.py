"""OpenAI chat messages: the canonical form used for rendering and matching, digests, and Hermes tool calls.

Everything here is pure text and data: no tokenizer, no template.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gyre.router.modelfamilies import ParsedReply

ROLES = ("system", "user", "assistant", "tool")
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


def normalize_messages(messages: list[dict[str, Any]], start: int = 0) -> list[dict[str, Any]]:
    """The canonical form of OpenAI chat messages, used both to render and to match requests.

    Keeps ``role``, ``content`` (always a string), ``name``, an assistant's non-empty ``reasoning_content`` (or
    vLLM's ``reasoning``) and ``tool_calls`` (arguments as a JSON string) and a tool message's ``tool_call_id``;
    drops every other key. ``developer`` becomes ``system``.
    Normalizing a normalized list returns an equal list. The result holds only dicts, lists and exact ``str``s
    (subclasses are copied to ``str``, as transformers does before rendering), so the template may see it as is.
    ``start`` is the index of the first message in the request, for error messages about a slice.
    """
    if not isinstance(messages, list):
        raise ValueError(f"messages must be a list of message objects, got {type(messages).__name__}")
    return [_normalize_message(start + i, message) for i, message in enumerate(messages)]


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
    out: dict[str, Any] = {"role": _exact(role), "content": _content_text(where, message.get("content"))}
    if "name" in message and message["name"] is not None:
        if not isinstance(message["name"], str):
            raise ValueError(f"{where}.name must be a string, got {type(message['name']).__name__}")
        out["name"] = _exact(message["name"])
    if role == "assistant":
        reasoning = message.get("reasoning_content")
        if reasoning is None:
            reasoning = message.get("reasoning")  # vLLM's newer name
        if reasoning is not None and not isinstance(reasoning, str):
            raise ValueError(f"{where}.reasoning_content must be a string, got {type(reasoning).__name__}")
        if reasoning:
            out["reasoning_content"] = _exact(reasoning)
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
        out["tool_call_id"] = _exact(call_id)
    return out


def _exact(text: str) -> str:
    """``text`` as an exact ``str``: a subclass could carry methods the template sandbox does not know."""
    return text if type(text) is str else str.__str__(text)


def _content_text(where: str, content: Any) -> str:
    """OpenAI content (a string, None, or a list of text parts) as one string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return _exact(content)
    if not isinstance(content, list):
        raise ValueError(
            f"{where}.content must be a string, null or a list of parts, got {type(content).__name__}"
        )
    texts: list[str] = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ValueError(f"{where}.content[{k}] must be a text part {{'type': 'text', 'text': str}}")
        texts.append(part["text"])
    return "".join(texts)  # always an exact str


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
    return {
        "id": _exact(call_id),
        "type": "function",
        "function": {"name": _exact(name), "arguments": _exact(arguments)},
    }


def offered_functions(tools: list[Any] | None) -> frozenset[str]:
    """The function names a request's ``tools`` offer (``tools[i].function.name``); anything else is ignored."""
    names: set[str] = set()
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str) and name:
            names.add(name)
    return frozenset(names)


def parse_tool_calls(text: str, offered: Collection[str] | None = None) -> ParsedReply:
    """Split decoded reply text into content and ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` calls.

    The Hermes format's parser (`gyre.router.modelfamilies`) on plain text: the rules are SGLang's, except that nothing the
    model wrote is dropped (``parameters`` is read as a synonym of ``arguments``; a block that is unterminated or
    breaks the rules is listed in ``malformed``, a call to a function not in ``offered`` in ``unknown``, and both
    stay in ``content`` as written). The router parses sampled ids instead, each marker matched as its token."""
    from gyre.router.modelfamilies import FORMATS

    plain = dataclasses.replace(FORMATS["hermes"], reasoning=None).bind({}, frozenset(), "")
    parser = plain.parser(offered=offered)
    parser.feed(text)
    parser.finish()
    result: ParsedReply = parser.result()
    return result

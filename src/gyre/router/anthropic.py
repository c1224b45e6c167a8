"""The Anthropic Messages API (``POST /v1/messages``) as a face of the router's chat path.

A request is translated into a chat request (``system`` -> a system message; an assistant's ``tool_use`` blocks ->
its ``tool_calls``, its ``thinking`` blocks -> its ``reasoning_content``; a user's ``tool_result`` blocks -> ``tool``
messages) and runs through `Router.chat` / `Router.chat_stream`: the same rendering, session, ``CallRecord`` and
continuation detection. The translation is deterministic, so a conversation that echoes back the replies it got is
one unbroken chain of calls. The reply's reasoning, text and tool calls (parsed as for chat) become ``thinking``,
``text`` and ``tool_use`` blocks; a ``tool_use`` id is the chat tool-call id, so the exact sampled arguments are
restored when the client echoes it. ``thinking`` blocks carry an empty ``signature`` (nothing is signed here);
``redacted_thinking`` blocks sent back are accepted and not rendered.

``tool_choice``: ``none`` renders no tools and keeps ``<tool_call>`` text as text (as chat's ``"none"``); ``any`` and
``tool`` become chat's ``required`` and a named function, which the chat path enforces with a grammar
(`gyre.router.constraints`); a named tool that was not offered is a 400. Images, documents and server tools are
refused (400): the router serves a text model.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from gyre.journal.records import Role
from gyre.router.openai_types import ChatRequest, MaxTokens, RouterError, TopP
from gyre.router.pool import CallControl
from gyre.router.routing import INLINE_MESSAGES, check_tools

if TYPE_CHECKING:
    from gyre.router.routing import Router

Event = tuple[str, dict[str, Any]]  # (SSE event name, its JSON data)
_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


class MessagesRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/messages``. Unknown fields (``metadata``, ``thinking``, ``service_tier``...) are ignored."""

    model: str
    messages: list[dict[str, Any]]
    max_tokens: MaxTokens  # required by the Messages API
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    top_p: TopP | None = None
    # accepted, not applied: the chat request has no top_k to carry it (yet)
    top_k: Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)] | None = None
    stream: bool = False


def error_body(error: RouterError) -> dict[str, Any]:
    """``error`` in the Messages API's shape."""
    kind = _ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": str(error)}}


# ---- request: Messages -> chat ------------------------------------------------------------------------------------
def _bad(message: str, param: str) -> RouterError:
    return RouterError(message, 400, param=param)


def _text_of(where: str, content: Any) -> str:
    """A string, or a list of text blocks, as one string (tool results, system)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or a list of text blocks", where)
    texts = []
    for k, block in enumerate(content):
        if (
            not isinstance(block, dict)
            or block.get("type") != "text"
            or not isinstance(block.get("text"), str)
        ):
            raise _bad(f"{where}[{k}] must be a text block {{'type': 'text', 'text': str}}", where)
        texts.append(block["text"])
    return "\n".join(texts)


def _arguments(where: str, value: Any) -> str:
    if not isinstance(value, dict):
        raise _bad(f"{where}.input must be an object", where)
    try:
        return json.dumps(value, ensure_ascii=False)  # as chat's normalisation writes object arguments
    except (ValueError, RecursionError):
        raise _bad(f"{where}.input cannot be encoded as JSON", where) from None


def _translate_message(index: int, message: Any) -> list[dict[str, Any]]:
    """One Messages-API message as chat messages (a user turn holding tool results becomes several)."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _bad(f"{where} must be an object", where)
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant"):
        raise _bad(f"{where}.role must be 'user' or 'assistant', got {role!r}", where)
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or a list of content blocks", where)
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    thinking: list[str] = []  # an assistant's thinking blocks' text
    calls: list[dict[str, Any]] = []
    for k, block in enumerate(content):
        at = f"{where}.content[{k}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise _bad(f"{at}.text must be a string", at)
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            call_id, name = block.get("id"), block.get("name")
            if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
                raise _bad(f"{at} must have a non-empty string id and name", at)
            arguments = _arguments(at, block.get("input"))
            calls.append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            )
        elif kind == "tool_result" and role == "user":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise _bad(f"{at}.tool_use_id must be the id of the tool_use block it answers", at)
            if texts:  # text before a result stays before it
                out.append({"role": "user", "content": "".join(texts)})
                texts = []
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text_of(f"{at}.content",
                                                                                      block.get("content"))})  # fmt: skip
        elif kind == "thinking" and role == "assistant":
            if not isinstance(block.get("thinking"), str):
                raise _bad(f"{at}.thinking must be a string", at)
            thinking.append(block["thinking"])
        elif kind == "redacted_thinking" and role == "assistant":
            continue  # another server's encrypted reasoning: nothing to render
        else:
            allowed = (
                "text, tool_use, thinking, redacted_thinking" if role == "assistant" else "text, tool_result"
            )
            raise _bad(f"{at}: a {role} content block must be one of {allowed}; got {kind!r}", at)
    if role == "assistant":
        reply: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if thinking:
            reply["reasoning_content"] = "".join(thinking)
        if calls:
            reply["tool_calls"] = calls
        out.append(reply)
    elif texts or not out:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _translate_messages(
    system: str | list[dict[str, Any]] | None, messages: list[Any]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if system is not None:
        text = _text_of("system", system)
        if text:
            out.append({"role": "system", "content": text})
    for i, message in enumerate(messages):
        out.extend(_translate_message(i, message))
    return out


def _translate_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    check_tools(tools)
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        name, schema = tool.get("name"), tool.get("input_schema")
        if tool.get("type", "custom") not in ("custom", None):
            raise _bad(
                f"{where}: server tools ({tool.get('type')!r}) are not supported; give input_schema", where
            )
        if not isinstance(name, str) or not name:
            raise _bad(f"{where}.name must be a non-empty string", where)
        if not isinstance(schema, dict):
            raise _bad(f"{where}.input_schema must be a JSON schema object", where)
        function: dict[str, Any] = {"name": name, "parameters": schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _translate_choice(choice: dict[str, Any] | None, tools: list[dict[str, Any]] | None) -> Any:
    if choice is None:
        return None
    kind = choice.get("type")
    if kind == "auto":
        return "auto"
    if kind == "none":
        return "none"
    if kind not in ("any", "tool"):
        raise _bad(f"tool_choice.type must be auto, any, tool or none; got {kind!r}", "tool_choice")
    if not tools:
        raise _bad(f"tool_choice {kind!r} needs tools", "tool_choice")
    if kind == "any":
        return "required"
    name = choice.get("name")
    offered = [t["function"]["name"] for t in tools]
    if name not in offered:
        raise _bad(f"tool_choice names the tool {name!r}, which tools does not offer (offered: {offered})",
                   "tool_choice")  # fmt: skip
    return {"type": "function", "function": {"name": name}}


def _stops(req: MessagesRequest) -> list[str]:
    return [s for s in req.stop_sequences or [] if s]


def _to_chat(req: MessagesRequest) -> ChatRequest:
    """The chat request ``req`` stands for (raises a 400 for what the Messages API would refuse)."""
    if not req.messages:
        raise _bad("messages must not be empty", "messages")
    tools = _translate_tools(req.tools)
    parallel = None
    if req.tool_choice is not None and req.tool_choice.get("disable_parallel_tool_use") is True:
        parallel = False
    return ChatRequest(
        model=req.model,
        messages=_translate_messages(req.system, req.messages),
        tools=tools,
        tool_choice=_translate_choice(req.tool_choice, tools),
        temperature=req.temperature,
        top_p=req.top_p,
        max_tokens=req.max_tokens,
        stop=_stops(req) or None,
        parallel_tool_calls=parallel,
        return_token_ids=bool(_stops(req)),  # to tell which stop sequence ended the reply (`_stop`)
    )


async def _translate(router: Router, token: str, req: MessagesRequest, stream: bool = False) -> ChatRequest:
    router.session(token)  # an unknown session is a 401 before its request is looked at
    if len(req.messages) <= INLINE_MESSAGES:
        chat = _to_chat(req)
    else:  # as the chat path does: a long conversation is translated off the event loop
        chat = await router.off_loop(_to_chat, req)
    if stream:  # usage in every chunk: message_start carries the prompt's tokens (vLLM's and SGLang's option)
        chat.stream, chat.stream_options = True, {"include_usage": True, "continuous_usage_stats": True}
    return chat


# ---- reply: chat -> Messages --------------------------------------------------------------------------------------
def _stop(
    router: Router, finish: str, token_ids: list[int] | None, stops: list[str]
) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished chat call; ``token_ids`` are its output's (asked for when the
    request has stop sequences: the sequence that matched is the one whose first occurrence ends first)."""
    if finish == "tool_calls":
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if stops and token_ids is not None:
        text = router.renderer.decode(token_ids)
        found = [(at + len(stop), stop) for stop in stops if (at := text.find(stop)) >= 0]
        if found:
            return "stop_sequence", min(found)[1]
    return "end_turn", None


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    arguments = json.loads(call["function"]["arguments"])  # the parser returns only an object's text
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": arguments}


def _message_id(chat_id: str) -> str:
    return "msg_" + chat_id.removeprefix("chatcmpl-")


def _usage(usage: dict[str, Any]) -> dict[str, int]:
    return {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]}


async def create(
    router: Router, token: str, req: MessagesRequest, role: Role = "main", control: CallControl | None = None
) -> dict[str, Any]:
    """One Messages-API ``message``, recorded as a chat call."""
    reply = await router.chat(token, await _translate(router, token, req), role, control)
    choice = reply["choices"][0]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    content.extend(_tool_use(c) for c in message.get("tool_calls") or [])
    stop_reason, stop_sequence = _stop(router, choice["finish_reason"], choice.get("token_ids"), _stops(req))
    return {
        "id": _message_id(reply["id"]),
        "type": "message",
        "role": "assistant",
        "model": router.model_name,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": _usage(reply["usage"]),
    }


async def stream(
    router: Router, token: str, req: MessagesRequest, role: Role = "main", control: CallControl | None = None
) -> AsyncIterator[Event]:
    """The same call as ``create``, as the Messages API's stream events while the chat call's chunks arrive.

    Reasoning streams as a ``thinking`` block, text as ``text`` blocks, as chat streams them (held back where it may
    open a tool call or a stop sequence); each tool call arrives whole, as soon as the chat stream has it, as a
    ``tool_use`` block with one ``input_json_delta`` (text after it opens a new ``text`` block). Nothing is yielded
    before the engine's first output, so a failure before it is still an HTTP error status.
    """
    chunks = router.chat_stream(token, await _translate(router, token, req, stream=True), role, control)
    async with contextlib.aclosing(chunks):  # type: ignore[type-var]  # an async generator
        blocks = _Blocks()
        usage: dict[str, Any] = {}
        finish, token_ids, started = "stop", None, False
        async for chunk in chunks:
            if chunk.get("usage"):
                usage = chunk["usage"]
            if not started:  # the first chunk: the engine has answered
                started = True
                yield "message_start", {"type": "message_start", "message": {
                    "id": _message_id(chunk["id"]), "type": "message", "role": "assistant",
                    "model": router.model_name, "content": [], "stop_reason": None, "stop_sequence": None,
                    "usage": {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": 0},
                }}  # fmt: skip
            # the final chunk's output ids, where the request's stop sequences asked for them
            token_ids = chunk.get("token_ids", token_ids)
            for choice in chunk["choices"]:
                delta = choice["delta"]
                for kind, key in (("thinking", "reasoning_content"), ("text", "content")):
                    if delta.get(key):
                        for e in blocks.add(kind, delta[key]):
                            yield e
                for call in delta.get("tool_calls") or []:
                    for e in blocks.tool_use(call):
                        yield e
                finish = choice["finish_reason"] or finish
        for e in blocks.close():
            yield e
    stop_reason, stop_sequence = _stop(router, finish, token_ids, _stops(req))
    yield "message_delta", {"type": "message_delta", "usage": _usage(usage),
                            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence}}  # fmt: skip
    yield "message_stop", {"type": "message_stop"}


class _Blocks:
    """A streamed reply's content blocks: one open at a time, each closed before the next one starts."""

    def __init__(self) -> None:
        self.index = -1  # the newest block's
        self.open: str | None = None  # the open block's type: "thinking" or "text"

    def add(self, kind: str, piece: str) -> list[Event]:
        """``piece`` of a ``thinking`` or ``text`` block, opening one if that is not the open block."""
        events = []
        if self.open != kind:
            events += self.close()
            self.index, self.open = self.index + 1, kind
            events.append(_block_start(self.index, {"type": kind, kind: ""}))
        events.append(_delta(self.index, {"type": f"{kind}_delta", kind: piece}))
        return events

    def tool_use(self, call: dict[str, Any]) -> list[Event]:
        """A whole ``tool_use`` block for a streamed chat tool call."""
        events = self.close()
        self.index += 1
        events.append(_block_start(self.index, {**_tool_use(call), "input": {}}))
        events.append(
            _delta(self.index, {"type": "input_json_delta", "partial_json": call["function"]["arguments"]})
        )
        events.append(_block_stop(self.index))
        return events

    def close(self) -> list[Event]:
        """Close the open block, if any (a ``thinking`` block gets its empty signature first)."""
        if self.open is None:
            return []
        events = []
        if self.open == "thinking":
            events.append(_delta(self.index, {"type": "signature_delta", "signature": ""}))
        self.open = None
        events.append(_block_stop(self.index))
        return events


def _block_start(index: int, block: dict[str, Any]) -> Event:
    return "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, delta: dict[str, Any]) -> Event:
    return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}


def _block_stop(index: int) -> Event:
    return "content_block_stop", {"type": "content_block_stop", "index": index}

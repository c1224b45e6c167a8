"""The Anthropic Messages API (``POST /v1/messages``) as a face of the router's chat path.

A request is translated into the router's chat messages (``system`` -> a system message; an assistant's
``tool_use`` blocks -> its ``tool_calls``; a user's ``tool_result`` blocks -> ``tool`` messages) and runs as a chat
call: the same rendering, the same session, the same ``CallRecord``, the same continuation detection. The
translation is deterministic, so a conversation that echoes back the replies it got is one unbroken chain of calls.
The reply's text and ``<tool_call>`` blocks (parsed as for chat) become ``text`` and ``tool_use`` blocks; a
``tool_use`` id is the chat tool-call id, so the exact sampled arguments are restored when the client echoes it.

``tool_choice``: ``none`` renders no tools and keeps ``<tool_call>`` text as text (as chat's ``"none"``); ``any`` and
``tool`` become chat's ``required`` and a named function, which the chat path enforces with a grammar
(`gyre.router.constraints`); a named tool that was not offered is a 400. Images, documents and server tools are refused (400): the router serves a text model.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from gyre.journal.records import Role
from gyre.router.openai_types import ChatRequest, MaxTokens, RouterError, TopP
from gyre.router.pool import CallControl, Generation
from gyre.router.routing import INLINE_MESSAGES, _hold_stops, _mapped, _parses_tools, check_tools

if TYPE_CHECKING:
    from gyre.router.routing import Router, _ChatCall

Event = tuple[str, dict[str, Any]]  # (SSE event name, its JSON data)
_SKIPPED_BLOCKS = frozenset({"thinking", "redacted_thinking"})  # the model's own reasoning: not re-rendered
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
        elif kind in _SKIPPED_BLOCKS and role == "assistant":
            continue
        else:
            allowed = "text, tool_use" if role == "assistant" else "text, tool_result"
            raise _bad(f"{at}: a {role} content block must be one of {allowed}; got {kind!r}", at)
    if role == "assistant":
        reply: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
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
    )


async def _start(router: Router, token: str, req: MessagesRequest) -> tuple[ChatRequest, _ChatCall]:
    session = router.session(token)
    if len(req.messages) <= INLINE_MESSAGES:
        chat = _to_chat(req)
    else:  # as the chat path does: a long conversation is translated off the event loop
        chat = await router.off_loop(_to_chat, req)
    call = await router._start_chat(session, chat)
    if req.top_k:
        call.params = msgspec.structs.replace(call.params, top_k=req.top_k)
    return chat, call


# ---- reply: chat -> Messages --------------------------------------------------------------------------------------
def _stop(gen: Generation, stops: list[str], tool_use: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished call."""
    if tool_use:
        return "tool_use", None
    if gen.finish_reason.get("type") == "length":
        return "max_tokens", None
    matched = gen.finish_reason.get("matched")
    if isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return "end_turn", None


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    arguments = json.loads(call["function"]["arguments"])  # the parser returns only an object's text
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": arguments}


def _message_id(call: _ChatCall) -> str:
    return "msg_" + call.call_id.removeprefix("chatcmpl-")


async def create(
    router: Router, token: str, req: MessagesRequest, role: Role = "main", control: CallControl | None = None
) -> dict[str, Any]:
    """One Messages-API ``message``, recorded as a chat call."""
    chat, call = await _start(router, token, req)
    session = router.session(token)
    gen = await router._generate(session, call.input_ids, call.params, call.top_n, control=control)
    body = router._finish_chat(session, chat, role, call, gen)
    message = body["choices"][0]["message"]
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    content.extend(_tool_use(c) for c in message.get("tool_calls") or [])
    stop_reason, stop_sequence = _stop(gen, _stops(req), bool(message.get("tool_calls")))
    return {
        "id": _message_id(call),
        "type": "message",
        "role": "assistant",
        "model": router.model_name,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {"input_tokens": len(call.inputs), "output_tokens": len(gen.output_ids)},
    }


async def stream(
    router: Router, token: str, req: MessagesRequest, role: Role = "main", control: CallControl | None = None
) -> AsyncIterator[Event]:
    """The same call as ``create``, as the Messages API's stream events while tokens arrive.

    Text streams as it is decoded (held back where it may open a ``<tool_call>`` block or a stop sequence, as chat
    streams); each tool call arrives whole at the end as a ``tool_use`` block with one ``input_json_delta``.
    Nothing is yielded before the engine's first output, so a failure before it is still an HTTP error status.
    """
    chat, call = await _start(router, token, req)
    session = router.session(token)
    engine_stream = router.pool.generate_stream(
        call.input_ids, call.params, session.affinity, call.top_n, control
    )
    stops = _stops(req)
    use_tools = _parses_tools(chat)
    ids: list[int] = []
    sent = ""  # text already streamed
    started = text_open = False
    gen: Generation | None = None
    async for item in _mapped(engine_stream):
        if not started:
            started = True
            yield "message_start", {"type": "message_start", "message": {
                "id": _message_id(call), "type": "message", "role": "assistant", "model": router.model_name,
                "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": len(call.inputs), "output_tokens": 0},
            }}  # fmt: skip
        if isinstance(item, Generation):
            gen = item
            break
        ids.extend(item.ids)
        visible = _hold_stops(router.renderer.streamable_content(ids, hold_tool_calls=use_tools), stops)
        if len(visible) > len(sent) and visible.startswith(sent):
            if not text_open:
                text_open = True
                yield _block_start(0, {"type": "text", "text": ""})
            yield _delta(0, {"type": "text_delta", "text": visible[len(sent) :]})
            sent = visible
    assert gen is not None
    session.affinity = gen.engine
    message = router._finish_chat(session, chat, role, call, gen)["choices"][0]["message"]
    content = message.get("content") or ""
    # text after tool calls, or held back to the end
    if content.startswith(sent) and len(content) > len(sent):
        if not text_open:
            text_open = True
            yield _block_start(0, {"type": "text", "text": ""})
        yield _delta(0, {"type": "text_delta", "text": content[len(sent) :]})
    if text_open:
        yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    calls = message.get("tool_calls") or []
    for index, tool_call in enumerate(calls, start=int(text_open)):
        block = _tool_use(tool_call)
        yield _block_start(index, {**block, "input": {}})
        yield _delta(index, {"type": "input_json_delta", "partial_json": tool_call["function"]["arguments"]})
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    stop_reason, stop_sequence = _stop(gen, stops, bool(calls))
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": {"input_tokens": len(call.inputs), "output_tokens": len(gen.output_ids)},
        },
    )
    yield "message_stop", {"type": "message_stop"}


def _block_start(index: int, block: dict[str, Any]) -> Event:
    return "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, delta: dict[str, Any]) -> Event:
    return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}

"""The OpenAI Responses API (``POST /v1/responses``, ``GET /v1/responses/{id}``) as a face of the chat path.

A request is translated into the router's chat messages (``instructions`` -> a system message; message items ->
messages; an assistant ``message`` item and the ``function_call`` items after it -> one assistant message with
``tool_calls``; ``function_call_output`` -> a ``tool`` message; ``reasoning`` items skipped) and runs as a chat call
through `Router.chat` / `Router.chat_stream`: the same rendering, session, ``CallRecord`` and continuation
detection. The translation is deterministic and a ``function_call``'s ``call_id`` is the chat tool-call id, so a
client that echoes its output items back, or names the response in ``previous_response_id``, extends the earlier
call token-exactly (one chain of records).

``previous_response_id``: each stored response keeps its conversation (its input items as chat messages and its reply)
linked to the response it continued, not copied, so a chain of n turns holds its messages once. Responses are kept per
session (a session never sees another's), at most `MAX_STORED` each (the oldest forgotten first; ``store: false`` keeps
none), and go with their session (the store holds sessions weakly). Each stored conversation was rendered within the
context, so a session holds at most `MAX_STORED` contexts' worth of messages (less where they share a chain), plus
each response's body for retrieval. As OpenAI does, the earlier ``instructions`` are not carried over: each
request's own come first.

Tool choice and ``text.format`` become chat's ``tool_choice`` and ``response_format``; enforcing them is the chat
path's business. Hosted tools (web search, files, computer use...), images and files are refused (400): the router
serves a text model and runs no tools itself.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from gyre.journal.records import Role
from gyre.router.openai_types import ChatRequest, MaxTokens, RouterError, Temperature, TopP
from gyre.router.pool import CallControl
from gyre.router.routing import INLINE_MESSAGES, check_tools

if TYPE_CHECKING:
    from gyre.router.routing import Router
    from gyre.router.sessions import Session

Event = tuple[str, dict[str, Any]]  # (SSE event name, its JSON data)
MAX_STORED = 64  # responses a session keeps for previous_response_id and retrieval; the oldest go first
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


class ResponsesRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/responses``. Unknown fields (``include``, ``truncation``, ``reasoning``, ``prompt_cache_key``...) are
    ignored, as scaffolds send extras."""

    model: str
    input: str | list[Any] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    text: dict[str, Any] | None = None
    stream: bool = False
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    previous_response_id: str | None = None
    conversation: Any = None  # the Conversations API: not served
    user: str | None = None
    return_token_ids: bool = (
        False  # Gyre extension, as in chat: prompt_token_ids and token_ids (not streamed)
    )


@dataclass(eq=False)
class _Stored:
    """A finished response: its conversation (linked to the one it continued) and its body for retrieval."""

    previous: _Stored | None
    items: list[
        dict[str, Any]
    ]  # its input items as chat messages, after the previous response's conversation
    reply: dict[str, Any]  # its output as the chat path's assistant message
    body: dict[str, Any]

    def conversation(self) -> list[dict[str, Any]]:
        """Every message of the conversation up to and including this response's reply (instructions excluded)."""
        chain: list[_Stored] = []
        node: _Stored | None = self
        while node is not None:
            chain.append(node)
            node = node.previous
        out: list[dict[str, Any]] = []
        for stored in reversed(chain):
            out += stored.items
            out.append(stored.reply)
        return out


# session -> its responses by id, oldest first; weak, so a closed session's responses go with it
_STORE: weakref.WeakKeyDictionary[Session, OrderedDict[str, _Stored]] = weakref.WeakKeyDictionary()


def _bad(message: str, param: str) -> RouterError:
    return RouterError(message, 400, param=param)


# ---- request: Responses -> chat -----------------------------------------------------------------------------------
def _text(where: str, content: Any) -> str:
    """A message's or a tool output's content: a string, or a list of text parts, as one string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or a list of input_text parts", where)
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("input_image", "input_file", "input_audio"):
            raise _bad(f"{where}[{k}]: {kind} is not served (the router serves a text model)", where)
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            raise _bad(f"{where}[{k}] must be a text part {{'type': 'input_text', 'text': str}}", where)
    return "".join(texts)


def _translate_input(items: str | list[Any] | None) -> list[dict[str, Any]]:
    """``input`` as chat messages: consecutive assistant text and function calls make one assistant message."""
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    assistant: dict[str, Any] | None = None  # the assistant message being gathered
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _bad(f"{where}.role must be user, system, developer or assistant; got {role!r}", where)
            text = _text(f"{where}.content", item.get("content"))
            if role == "assistant":
                if assistant is None or assistant.get("tool_calls"):
                    assistant = {"role": "assistant", "content": ""}
                    out.append(assistant)
                assistant["content"] += text
            else:
                assistant = None
                out.append({"role": role, "content": text})
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
            if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
                raise _bad(f"{where} must have a non-empty string call_id and name", where)
            if not isinstance(arguments, str):
                raise _bad(f"{where}.arguments must be a JSON string", where)
            if assistant is None:
                assistant = {"role": "assistant", "content": ""}
                out.append(assistant)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            assistant.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise _bad(f"{where}.call_id must be the call_id of the function_call it answers", where)
            assistant = None
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text(f"{where}.output", item.get("output"))})  # fmt: skip
        elif kind == "reasoning":
            continue  # the model's own reasoning: not re-rendered
        else:
            raise _bad(f"{where}: input items of type {kind!r} are not served; use message, function_call, "
                       "function_call_output", where)  # fmt: skip
    return out


def _translate_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    check_tools(tools)
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        kind = tool.get("type")
        if kind != "function":
            raise _bad(f"{where}: {kind!r} tools are not served (the router runs no tools); give function tools",
                       where)  # fmt: skip
        name, parameters = tool.get("name"), tool.get("parameters")
        if not isinstance(name, str) or not name:
            raise _bad(f"{where}.name must be a non-empty string", where)
        if parameters is not None and not isinstance(parameters, dict):
            raise _bad(f"{where}.parameters must be a JSON schema object", where)
        function: dict[str, Any] = {"name": name}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        if parameters is not None:
            function["parameters"] = parameters
        out.append({"type": "function", "function": function})
    return out


def _translate_choice(choice: str | dict[str, Any] | None, tools: list[dict[str, Any]] | None) -> Any:
    if choice is None or choice in ("auto", "none"):
        return choice
    if choice == "required" or (isinstance(choice, dict) and choice.get("type") == "function"):
        if not tools:
            raise _bad("tool_choice requires tools", "tool_choice")
        if choice == "required":
            return "required"
        assert isinstance(choice, dict)
        name = choice.get("name")
        offered = [t["function"]["name"] for t in tools]
        if name not in offered:
            raise _bad(f"tool_choice names the function {name!r}, which tools does not offer (offered: {offered})",
                       "tool_choice")  # fmt: skip
        return {"type": "function", "function": {"name": name}}
    raise _bad(f"tool_choice must be auto, none, required or {{'type': 'function', 'name': ...}}; got {choice!r}",
               "tool_choice")  # fmt: skip


def _translate_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format``."""
    spec = (text or {}).get("format")
    if spec is None:
        return None
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind != "json_schema":
        raise _bad(f"text.format.type must be text, json_object or json_schema; got {kind!r}", "text.format")
    assert isinstance(spec, dict)
    name, schema = spec.get("name"), spec.get("schema")
    if not isinstance(name, str) or not name:
        raise _bad("text.format.name must be a non-empty string", "text.format.name")
    if not isinstance(schema, dict):
        raise _bad("text.format.schema must be a JSON schema object", "text.format.schema")
    json_schema: dict[str, Any] = {"name": name, "schema": schema}
    if isinstance(spec.get("strict"), bool):
        json_schema["strict"] = spec["strict"]
    if isinstance(spec.get("description"), str):
        json_schema["description"] = spec["description"]
    return {"type": "json_schema", "json_schema": json_schema}


def _to_chat(req: ResponsesRequest, previous: _Stored | None) -> tuple[ChatRequest, list[dict[str, Any]]]:
    """The chat request ``req`` stands for, and its input items as chat messages (what a stored response keeps)."""
    if req.conversation is not None:
        raise _bad("conversation is not served; continue a conversation with previous_response_id",
                   "conversation")  # fmt: skip
    items = _translate_input(req.input)
    if not items:
        raise _bad("input must hold at least one message or item", "input")
    tools = _translate_tools(req.tools)
    head = [{"role": "system", "content": req.instructions}] if req.instructions else []
    earlier = previous.conversation() if previous is not None else []
    chat = ChatRequest(
        model=req.model,
        messages=head + earlier + items,
        tools=tools,
        tool_choice=_translate_choice(req.tool_choice, tools),
        temperature=req.temperature,
        top_p=req.top_p,
        max_tokens=req.max_output_tokens,
        parallel_tool_calls=req.parallel_tool_calls,
        response_format=_translate_format(req.text),
        return_token_ids=req.return_token_ids,
    )
    return chat, items


async def _prepare(
    router: Router, token: str, req: ResponsesRequest, stream: bool
) -> tuple[ChatRequest, _Stored]:
    """The chat request, and the response to store once it is answered (its reply and body still empty)."""
    session = router.session(token)
    previous = None
    if req.previous_response_id is not None:
        previous = _STORE.get(session, OrderedDict()).get(req.previous_response_id)
        if previous is None:
            raise _bad(
                f"Previous response with id '{req.previous_response_id}' not found.", "previous_response_id"
            )
    long = isinstance(req.input, list) and len(req.input) > INLINE_MESSAGES
    if long:  # as the chat path: a long input is translated off the event loop
        chat, items = await router.off_loop(_to_chat, req, previous)
    else:
        chat, items = _to_chat(req, previous)
    if stream:
        chat.stream, chat.stream_options = True, {"include_usage": True}
    return chat, _Stored(previous, items, {}, {})


def _remember(router: Router, token: str, req: ResponsesRequest, pending: _Stored, reply: dict[str, Any],
              body: dict[str, Any]) -> None:  # fmt: skip
    if req.store is False:
        return
    pending.reply, pending.body = reply, body
    stored = _STORE.setdefault(router.session(token), OrderedDict())
    stored[body["id"]] = pending
    while len(stored) > MAX_STORED:
        stored.popitem(last=False)


def retrieve(router: Router, token: str, response_id: str) -> dict[str, Any]:
    """``GET /v1/responses/{id}``: a response this session stored."""
    stored = _STORE.get(router.session(token), OrderedDict()).get(response_id)
    if stored is None:
        raise RouterError(f"Response with id '{response_id}' not found.", 404, "not_found_error")
    return stored.body


# ---- reply: chat -> Responses -------------------------------------------------------------------------------------
def _ids(chat_id: str) -> str:
    return chat_id.removeprefix("chatcmpl-")


def _message_item(chat_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {
        "id": f"msg_{_ids(chat_id)}",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def _call_item(call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    function = call["function"]
    return {"id": "fc_" + call["id"].removeprefix("call_"), "type": "function_call", "status": status,
            "call_id": call["id"], "name": function["name"], "arguments": function["arguments"]}  # fmt: skip


def _usage(router: Router, token: str, chat_id: str, usage: dict[str, int]) -> dict[str, Any]:
    record = next((r for r in reversed(router.session(token).records) if r.call_id == chat_id), None)
    cached = (
        record.prefix_len if record is not None else 0
    )  # the tokens the call shares with the one it extends
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
    }


def _shell(router: Router, req: ResponsesRequest, chat_id: str, created: float) -> dict[str, Any]:
    """The response object without its outcome: what ``response.created`` carries."""
    tools = [{**t, "strict": t.get("strict", True)} for t in req.tools or []]
    fmt = (req.text or {}).get("format") or {"type": "text"}
    return {
        "id": f"resp_{_ids(chat_id)}",
        "object": "response",
        "created_at": int(created),
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": router.model_name,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": req.store is not False,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "text": {"format": fmt},
        "tool_choice": req.tool_choice or "auto",
        "tools": tools,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": req.user,
        "metadata": req.metadata or {},
    }


def _finish(body: dict[str, Any], output: list[dict[str, Any]], length: bool, usage: dict[str, Any]) -> None:
    body["status"] = "incomplete" if length else "completed"
    body["incomplete_details"] = {"reason": "max_output_tokens"} if length else None
    body["output"], body["usage"] = output, usage
    if not length:
        body["completed_at"] = int(time.time())


async def create(
    router: Router, token: str, req: ResponsesRequest, role: Role = "main", control: CallControl | None = None
) -> dict[str, Any]:
    """One ``response``, recorded as a chat call."""
    chat, pending = await _prepare(router, token, req, stream=False)
    reply = await router.chat(token, chat, role, control)
    choice = reply["choices"][0]
    message, length = choice["message"], choice["finish_reason"] == "length"
    calls = message.get("tool_calls") or []
    output = []
    if message.get("content") or not calls:
        output.append(
            _message_item(reply["id"], message.get("content") or "", "incomplete" if length else "completed")
        )
    output += [_call_item(c) for c in calls]
    body = _shell(router, req, reply["id"], reply["created"])
    _finish(body, output, length, _usage(router, token, reply["id"], reply["usage"]))
    if req.return_token_ids:
        body["prompt_token_ids"], body["token_ids"] = reply["prompt_token_ids"], choice["token_ids"]
    _remember(router, token, req, pending, message, body)
    return body


async def stream(
    router: Router, token: str, req: ResponsesRequest, role: Role = "main", control: CallControl | None = None
) -> AsyncIterator[Event]:
    """The same call as ``create``, as the Responses API's stream events while tokens arrive.

    Text streams as chat streams it (held back where it may open a ``<tool_call>`` block); each function call arrives
    whole at the end, its arguments in one delta. Nothing is yielded before the engine's first output, so a failure
    before it is still an HTTP error status; a failure after it ends the stream with ``error`` and ``response.failed``.
    """
    chat, pending = await _prepare(router, token, req, stream=True)
    chunks = router.chat_stream(token, chat, role, control)
    async with contextlib.aclosing(chunks):  # type: ignore[type-var]  # an async generator
        sequence = 0

        def event(kind: str, **data: Any) -> Event:
            nonlocal sequence
            sequence += 1
            return kind, {"type": kind, "sequence_number": sequence - 1, **data}

        first = await anext(chunks)  # errors before the first token surface as an HTTP status
        body = _shell(router, req, first["id"], first["created"])
        yield event("response.created", response=dict(body))
        yield event("response.in_progress", response=dict(body))
        output: list[dict[str, Any]] = []
        text: str | None = None  # the message item's text while it is open
        calls: list[dict[str, Any]] = []
        finish, usage = "stop", None
        item_id = f"msg_{_ids(first['id'])}"

        def close_text(status: str) -> list[Event]:
            nonlocal text
            if text is None:
                return []
            item = _message_item(first["id"], text, status)
            part, at, text = item["content"][0], len(output), None
            output.append(item)
            return [
                event("response.output_text.done", item_id=item_id, output_index=at, content_index=0, text=part["text"],
                      logprobs=[]),
                event("response.content_part.done", item_id=item_id, output_index=at, content_index=0, part=part),
                event("response.output_item.done", output_index=at, item=item),
            ]  # fmt: skip

        try:
            async for chunk in _chain(first, chunks):
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk["choices"]:
                    delta = choice["delta"]
                    if delta.get("content"):
                        if text is None:
                            text = ""
                            at = len(output)
                            yield event("response.output_item.added", output_index=at,
                                        item={**_message_item(first["id"], "", "in_progress"), "content": []})  # fmt: skip
                            yield event("response.content_part.added", item_id=item_id, output_index=at,
                                        content_index=0, part={"type": "output_text", "text": "", "annotations": []})  # fmt: skip
                        text += delta["content"]
                        yield event("response.output_text.delta", item_id=item_id, output_index=len(output),
                                    content_index=0, delta=delta["content"], logprobs=[])  # fmt: skip
                    calls += [
                        {k: v for k, v in c.items() if k != "index"} for c in delta.get("tool_calls") or []
                    ]
                    finish = choice["finish_reason"] or finish
        except RouterError as exc:  # mid-stream: the status is sent
            yield event("error", code=exc.type, message=str(exc), param=exc.param)
            body["status"], body["error"] = "failed", {"code": "server_error", "message": str(exc)}
            yield event("response.failed", response=body)
            return
        length = finish == "length"
        status = "incomplete" if length else "completed"
        if text is None and not calls:  # an empty reply is still a message, as create answers it
            text = ""
            yield event("response.output_item.added", output_index=0,
                        item={**_message_item(first["id"], "", "in_progress"), "content": []})  # fmt: skip
            yield event("response.content_part.added", item_id=item_id, output_index=0, content_index=0,
                        part={"type": "output_text", "text": "", "annotations": []})  # fmt: skip
        for e in close_text(status):
            yield e
        message_text = output[0]["content"][0]["text"] if output else ""
        for call in calls:
            item, at = _call_item(call), len(output)
            output.append(item)
            yield event(
                "response.output_item.added",
                output_index=at,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=at,
                        delta=item["arguments"])  # fmt: skip
            yield event("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                        arguments=item["arguments"], name=item["name"])  # fmt: skip
            yield event("response.output_item.done", output_index=at, item=item)
        assert usage is not None  # chat_stream's last chunk (include_usage)
        _finish(body, output, length, _usage(router, token, first["id"], usage))
        reply: dict[str, Any] = {"role": "assistant", "content": message_text or None}
        if calls:
            reply["tool_calls"] = calls
        _remember(router, token, req, pending, reply, body)
        yield event("response.incomplete" if length else "response.completed", response=body)


async def _chain(first: dict[str, Any], rest: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    yield first
    async for chunk in rest:
        yield chunk

"""The OpenAI Responses API (``POST /v1/responses``, ``GET /v1/responses/{id}``) as a face of the chat path.

A request is translated into the router's chat messages (``instructions`` -> a system message; message items ->
messages; an assistant ``message`` item and the ``function_call`` items after it -> one assistant message with
``tool_calls``; ``function_call_output`` -> a ``tool`` message; a ``reasoning`` item -> the next assistant message's
``reasoning_content``) and runs as a chat call through `Router.chat` / `Router.chat_stream`: the same rendering,
session, ``CallRecord`` and continuation detection. The reply's reasoning, text and tool calls become a ``reasoning``
item (its text as one ``reasoning_text`` part, no summary), a ``message`` item and ``function_call`` items, in that
order; a ``reasoning`` item holding only ``encrypted_content`` (another server's) is accepted and not rendered.
The translation is deterministic and a ``function_call``'s ``call_id`` is the chat tool-call id, so a client that
echoes its output items back, or names the response in ``previous_response_id``, extends the earlier call
token-exactly (one chain of records).

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
    reasoning: str | None = None  # a reasoning item's text, for the assistant message after it

    def open_assistant() -> dict[str, Any]:
        nonlocal reasoning
        message: dict[str, Any] = {"role": "assistant", "content": ""}
        if reasoning is not None:
            message["reasoning_content"], reasoning = reasoning, None
        out.append(message)
        return message

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
                    assistant = open_assistant()
                assistant["content"] += text
            else:
                assistant = reasoning = None
                out.append({"role": role, "content": text})
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
            if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
                raise _bad(f"{where} must have a non-empty string call_id and name", where)
            if not isinstance(arguments, str):
                raise _bad(f"{where}.arguments must be a JSON string", where)
            if assistant is None:
                assistant = open_assistant()
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            assistant.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise _bad(f"{where}.call_id must be the call_id of the function_call it answers", where)
            assistant = reasoning = None
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text(f"{where}.output", item.get("output"))})  # fmt: skip
        elif kind == "reasoning":
            text = _reasoning_text(where, item)
            if (
                text and assistant is not None
            ):  # more of the open turn's reasoning (gpt-oss: after a preamble)
                assistant["reasoning_content"] = assistant.get("reasoning_content", "") + text
            elif text:  # encrypted_content alone: nothing to render
                reasoning = (reasoning or "") + text
        else:
            raise _bad(f"{where}: input items of type {kind!r} are not served; use message, function_call, "
                       "function_call_output", where)  # fmt: skip
    return out


def _reasoning_text(where: str, item: dict[str, Any]) -> str:
    """A reasoning item's text: its ``content`` parts' text, else its ``summary`` parts' ("" where it has neither)."""
    for field, separator in (("content", ""), ("summary", "\n\n")):
        parts = item.get(field)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise _bad(f"{where}.{field} must be a list of text parts", where)
        texts = []
        for k, part in enumerate(parts):
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                raise _bad(f"{where}.{field}[{k}] must be a text part {{'type': ..., 'text': str}}", where)
            texts.append(part["text"])
        if texts:
            return separator.join(texts)
    return ""


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


def _reasoning_item(chat_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}]
    return {
        "id": f"rs_{_ids(chat_id)}",
        "type": "reasoning",
        "summary": [],
        "content": content,
        "status": status,
    }


def _call_item(call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    function = call["function"]
    return {"id": "fc_" + call["id"].removeprefix("call_"), "type": "function_call", "status": status,
            "call_id": call["id"], "name": function["name"], "arguments": function["arguments"]}  # fmt: skip


def _reply(content: str | None, reasoning: str | None, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The reply as the chat path's assistant message (what a stored response keeps)."""
    reply: dict[str, Any] = {"role": "assistant", "content": content or None}
    if reasoning:
        reply["reasoning_content"] = reasoning
    if calls:
        reply["tool_calls"] = calls
    return reply


def _usage(router: Router, token: str, chat_id: str, usage: dict[str, Any]) -> dict[str, Any]:
    record = next((r for r in reversed(router.session(token).records) if r.call_id == chat_id), None)
    cached = (
        record.prefix_len if record is not None else 0
    )  # the tokens the call shares with the one it extends
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": reasoning},
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
    content, reasoning = message.get("content") or "", message.get("reasoning_content") or ""
    calls = message.get("tool_calls") or []
    output = [_reasoning_item(reply["id"], reasoning)] if reasoning else []
    if content or not calls:
        output.append(_message_item(reply["id"], content, "incomplete" if length else "completed"))
    output += [_call_item(c) for c in calls]
    body = _shell(router, req, reply["id"], reply["created"])
    _finish(body, output, length, _usage(router, token, reply["id"], reply["usage"]))
    if req.return_token_ids:
        body["prompt_token_ids"], body["token_ids"] = reply["prompt_token_ids"], choice["token_ids"]
    _remember(router, token, req, pending, _reply(content, reasoning, calls), body)
    return body


async def stream(
    router: Router, token: str, req: ResponsesRequest, role: Role = "main", control: CallControl | None = None
) -> AsyncIterator[Event]:
    """The same call as ``create``, as the Responses API's stream events while tokens arrive.

    Reasoning and text stream as chat streams them (reasoning first; text held back where it may open a tool call);
    each function call arrives whole after the message, its arguments in one delta. Nothing is yielded before the
    engine's first output, so a failure before it is still an HTTP error status; a failure after it ends the stream
    with ``error`` and ``response.failed``.
    """
    chat, pending = await _prepare(router, token, req, stream=True)
    chunks = router.chat_stream(token, chat, role, control)
    async with contextlib.aclosing(chunks):  # type: ignore[type-var]  # an async generator
        first = await anext(chunks)  # errors before the first token surface as an HTTP status
        out = _Output(first["id"])
        body = _shell(router, req, first["id"], first["created"])
        yield out.event("response.created", response=dict(body))
        yield out.event("response.in_progress", response=dict(body))
        calls: list[dict[str, Any]] = []
        finish, usage = "stop", None
        try:
            async for chunk in _chain(first, chunks):
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk["choices"]:
                    delta = choice["delta"]
                    for kind, key in (("reasoning", "reasoning_content"), ("message", "content")):
                        if delta.get(key):
                            for e in out.add(kind, delta[key]):
                                yield e
                    calls += [
                        {k: v for k, v in c.items() if k != "index"} for c in delta.get("tool_calls") or []
                    ]
                    finish = choice["finish_reason"] or finish
        except RouterError as exc:  # mid-stream: the status is sent
            yield out.event("error", code=exc.type, message=str(exc), param=exc.param)
            body["status"], body["error"] = "failed", {"code": "server_error", "message": str(exc)}
            yield out.event("response.failed", response=body)
            return
        length = finish == "length"
        if not out.texts["message"] and not calls:  # an empty reply is still a message, as create answers it
            for e in out.start("message"):
                yield e
        for e in out.close("incomplete" if length else "completed"):
            yield e
        for call in calls:
            for e in out.call(call):
                yield e
        assert usage is not None  # chat_stream's last chunk (include_usage)
        _finish(body, out.items, length, _usage(router, token, first["id"], usage))
        _remember(
            router, token, req, pending, _reply(out.texts["message"], out.texts["reasoning"], calls), body
        )
        yield out.event("response.incomplete" if length else "response.completed", response=body)


_PARTS: dict[str, dict[str, Any]] = {  # an item's content part as it starts
    "reasoning": {"type": "reasoning_text", "text": ""},
    "message": {"type": "output_text", "text": "", "annotations": []},
}
_TEXT_EVENTS = {"reasoning": "response.reasoning_text", "message": "response.output_text"}


class _Output:
    """A streamed response's events, numbered, and its output items: a reasoning item and a message item stream one
    at a time (each ends when the next starts), then the function calls come whole."""

    def __init__(self, chat_id: str) -> None:
        self.chat_id = chat_id
        self.items: list[dict[str, Any]] = []  # the finished items, in output order
        self.texts = {
            "reasoning": "",
            "message": "",
        }  # each kind's text in all (what the reply is remembered as)
        self.current = ""  # the text of the item being streamed
        self.count = {"reasoning": 0, "message": 0}  # items of each kind started
        self.streaming: str | None = None  # the kind of item being streamed: "reasoning" or "message"
        self.sequence = 0  # the next event's sequence_number

    def event(self, kind: str, **data: Any) -> Event:
        """The next event."""
        self.sequence += 1
        return kind, {"type": kind, "sequence_number": self.sequence - 1, **data}

    def item(self, kind: str, text: str, status: str) -> dict[str, Any]:
        """The ``kind`` item being streamed, holding ``text``: the first of its kind has the id a whole response's
        item has; a later one (gpt-oss reasoning again after a preamble) an id of its own."""
        item = (_reasoning_item if kind == "reasoning" else _message_item)(self.chat_id, text, status)
        if self.count[kind] > 1:
            item["id"] += f"_{self.count[kind] - 1}"
        return item

    def start(self, kind: str) -> list[Event]:
        """End the item being streamed, if any, and start a ``kind`` item."""
        events = self.close("completed")
        self.streaming, at, self.current = kind, len(self.items), ""
        self.count[kind] += 1
        item = {**self.item(kind, "", "in_progress"), "content": []}
        return [
            *events,
            self.event("response.output_item.added", output_index=at, item=item),
            self.event("response.content_part.added", item_id=item["id"], output_index=at, content_index=0,
                       part=_PARTS[kind]),
        ]  # fmt: skip

    def add(self, kind: str, piece: str) -> list[Event]:
        """``piece`` of the ``kind`` item's text, starting that item if it is not the one being streamed."""
        events = self.start(kind) if self.streaming != kind else []
        self.texts[kind] += piece
        self.current += piece
        item_id = self.item(kind, "", "in_progress")["id"]
        logprobs: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        events.append(self.event(f"{_TEXT_EVENTS[kind]}.delta", item_id=item_id, output_index=len(self.items),
                                 content_index=0, delta=piece, **logprobs))  # fmt: skip
        return events

    def close(self, status: str) -> list[Event]:
        """End the item being streamed, if any: a message with ``status``, reasoning always complete."""
        kind = self.streaming
        if kind is None:
            return []
        item = self.item(kind, self.current, status if kind == "message" else "completed")
        part, at, item_id = item["content"][0], len(self.items), item["id"]
        self.items.append(item)
        self.streaming = None
        logprobs: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        return [
            self.event(f"{_TEXT_EVENTS[kind]}.done", item_id=item_id, output_index=at, content_index=0,
                       text=part["text"], **logprobs),
            self.event("response.content_part.done", item_id=item_id, output_index=at, content_index=0, part=part),
            self.event("response.output_item.done", output_index=at, item=item),
        ]  # fmt: skip

    def call(self, call: dict[str, Any]) -> list[Event]:
        """A whole ``function_call`` item."""
        item, at = _call_item(call), len(self.items)
        self.items.append(item)
        return [
            self.event("response.output_item.added", output_index=at,
                       item={**item, "arguments": "", "status": "in_progress"}),
            self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=at,
                       delta=item["arguments"]),
            self.event("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                       arguments=item["arguments"], name=item["name"]),
            self.event("response.output_item.done", output_index=at, item=item),
        ]  # fmt: skip


async def _chain(first: dict[str, Any], rest: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    yield first
    async for chunk in rest:
        yield chunk

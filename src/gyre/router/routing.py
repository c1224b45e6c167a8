"""The router's in-process API: OpenAI chat and completions over the engine pool, with token-exact records.

``Router`` is what the HTTP server wraps and what in-driver agents call directly. Every call becomes one
``CallRecord``, journaled before the response is returned and kept in its session.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from gyre.config import RouterConfig
from gyre.errors import ConfigError, EngineCapacityError, EngineRequestError
from gyre.journal import Journal
from gyre.journal.records import ROLE_PRIORITY, CallRecord, CallTiming, Divergence, Role
from gyre.protocol import SamplingParams
from gyre.router.constraints import constraint, needs_grammar, rendered_tools
from gyre.router.messages import normalize_messages, offered_functions
from gyre.router.modelfamilies import Delta, ParsedReply
from gyre.router.openai_types import ChatRequest, CompletionRequest, RouterError
from gyre.router.pool import CallAborted, CallControl, Chunk, EnginePool, Generation, NoCapacity
from gyre.router.render import ChatRenderer
from gyre.router.sessions import CallGate, CallStatistics, IdSpan, Session, SessionStore, Turn

T = TypeVar("T")
log = logging.getLogger(__name__)

ROLES: frozenset[str] = frozenset(ROLE_PRIORITY)
# Requests with more text than this (characters) are rendered and encoded on the render thread, not the event
# loop (~2 us a character: 8192 characters hold the loop for up to ~20 ms).
INLINE_RENDER_CHARS = 8192
INLINE_MESSAGES = 2048  # a request with more messages is normalised and measured on the decode thread
# a request's tools: real scaffolds send tens of tools, each schema a few hundred values, nested a few levels
MAX_TOOLS = 512
MAX_TOOLS_DEPTH = 64
MAX_TOOLS_NODES = 100_000


class Router:
    """Sessions + rendering + engine pool + journal."""

    def __init__(
        self, cfg: RouterConfig, renderer: ChatRenderer | None = None, pool: EnginePool | None = None
    ):
        if renderer is None:
            if not cfg.model_path:
                raise ConfigError("router.model_path is empty: the router needs the served model's tokenizer")
            renderer = ChatRenderer.from_model_dir(cfg.model_path, cfg.tool_parser, cfg.reasoning_parser)
        self.cfg = cfg
        self.renderer = renderer
        self.model_name = cfg.model_name or Path(cfg.model_path).name or "gyre"
        self.pool = pool or EnginePool.from_config(cfg)
        for url in cfg.engines:
            self.pool.add(url)
        self.sessions = SessionStore()
        self.journal = Journal(cfg.journal_dir, fsync=cfg.journal_fsync) if cfg.journal_dir else None
        self.context_length = cfg.context_length or _model_context_length(cfg.model_path)  # 0: unknown
        self.gate = CallGate(cfg.max_calls_per_session, cfg.max_calls)
        # values a request body may hold (counted before decoding): a token-id prompt as long as the context fits
        self.max_json_values = max(cfg.max_json_values, self.context_length + 64)
        # One thread renders long requests, one at a time: the tokenizer's batch encode releases the GIL, so the
        # event loop keeps serving every other session meanwhile.
        self._render_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gyre-render")
        # Another decodes large bodies, one at a time (issue 31: 300,000 empty objects took the loop 0.3 s): a flood
        # of them queues behind itself, and the loop gets the interpreter back every switch interval meanwhile.
        self._decode_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gyre-decode")

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the decode thread."""
        return await asyncio.get_running_loop().run_in_executor(self._decode_thread, fn, *args)

    async def aclose(self) -> None:
        """Close engine clients, the render and decode threads and the journal."""
        await self.pool.aclose()
        self._render_thread.shutdown(wait=False, cancel_futures=True)
        self._decode_thread.shutdown(wait=False, cancel_futures=True)
        if self.journal is not None:
            self.journal.close()

    # ---- sessions -----------------------------------------------------------------------------------------------
    def open_session(self, execution_id: str | None = None) -> str:
        """A new session token for one execution."""
        return self.sessions.open(execution_id).token

    def session(self, token: str) -> Session:
        """The session for ``token``; an unknown token is a 401."""
        session = self.sessions.get(token)
        if session is None:
            raise RouterError("unknown session token", 401, "authentication_error")
        return session

    @contextlib.asynccontextmanager
    async def admit(self, token: str) -> AsyncIterator[Session]:
        """A slot for one call of ``token``'s session (`CallGate`): the agent API holds it from before it reads a
        call's body until the call is answered; a call past the session's limit waits for it here."""
        session = self.session(token)
        async with self.gate.admit(session):
            yield session

    def call_statistics(self, token: str) -> CallStatistics:
        """``token``'s calls at the gate: running, waiting, the most that ran at once."""
        return self.gate.statistics(self.session(token))

    def records(self, token: str) -> list[CallRecord]:
        """This session's call records, in call order."""
        return list(self.session(token).records)

    # ---- chat ---------------------------------------------------------------------------------------------------
    def _check_model(self, model: str) -> None:
        if model not in (self.model_name, "default", ""):
            raise RouterError(f"model {model!r} does not exist; this router serves {self.model_name!r}", 404,
                              "not_found_error", "model")  # fmt: skip

    async def _prepare_chat(
        self, session: Session, req: ChatRequest, tools: list[dict[str, Any]] | None
    ) -> tuple[Turn | None, list[int], Divergence | None]:
        """The earlier call this request extends (if any), the ids to append, and where they differ from the
        template's canonical render: rendering costs the new messages.

        With a parent, the input is ``parent.full`` + ids; without one, ``ids`` is the whole rendered input.
        ``tools`` are those rendered (`rendered_tools`). A request that cannot fit the context is refused before it
        is rendered; a long one renders off the loop. A request that extends an earlier call but cannot be chained
        (the template shows no turn boundary; or a divergence with ``router.continuation = "canonical"``) is a new
        branch whose record says why.
        """
        kwargs = req.chat_template_kwargs
        divergence: Divergence | None = None
        try:
            parent = session.find_extended(req.messages, tools)
            if parent is not None:
                at = len(parent.raw_messages)
                reply = normalize_messages([self._restore(session, req.messages[at])], at)[0]
                if _without_reasoning(reply) == _without_reasoning(parent.reply):
                    new = normalize_messages(
                        [self._restore(session, m) for m in req.messages[at + 1 :]], at + 1
                    )
                    chars = self._check_fits(len(parent.full), new, tools)
                    render = self.renderer.render_continuation
                    context = self._last_turn(session, parent)
                    try:
                        ids, divergence = await self._render(
                            chars, render, parent.reply, new, parent.output_ids, tools, kwargs, context
                        )
                    except ValueError as exc:
                        divergence = Divergence(kind="unchained", index=0)
                        log.warning("session %s: a call could not be chained, rendered as a new branch: %s",
                                    session.execution_id, exc)  # fmt: skip
                    else:
                        if divergence is not None:  # an offset in the reply turn -> one in the input
                            start = len(parent.full) - len(parent.output_ids)
                            divergence = Divergence(kind=divergence.kind, index=start + divergence.index)
                        if divergence is None or self.cfg.continuation == "exact":
                            return parent, ids, divergence
            if len(req.messages) <= INLINE_MESSAGES:
                normalized, chars = self._normalize_and_fit(session, req.messages, tools)
            else:  # 150,000 empty messages took the loop 0.3 s to normalise and count before their 413
                normalized, chars = await self.off_loop(self._normalize_and_fit, session, req.messages, tools)
            if chars <= INLINE_RENDER_CHARS:
                return None, self.renderer.render_full(normalized, tools, kwargs), divergence
            key, cached = self.renderer.cached_render(normalized, tools, kwargs)
            if cached is not None:
                return None, cached, divergence
            ids = await self._render(chars, self.renderer.render_uncached, normalized, tools, kwargs)
            self.renderer.remember_render(key, ids)
            return None, ids, divergence
        except RouterError:
            raise
        except ValueError as exc:
            raise RouterError(f"invalid messages: {exc}", 400, param="messages") from None
        except Exception as exc:  # a template that raises on this conversation; a structure nested too deeply
            raise RouterError(
                f"the chat template cannot render these messages: {exc!r}", 422, param="messages"
            ) from None

    def _last_turn(self, session: Session, parent: Turn) -> list[dict[str, Any]]:
        """The messages of ``parent``'s request from its last assistant turn on (normalised), which the reply
        followed: what the template may render the reply differently after (a tool output, a user message)."""
        messages = parent.raw_messages
        at = len(messages) - 1
        while at >= 0 and not (isinstance(messages[at], dict) and messages[at].get("role") == "assistant"):
            at -= 1
        if at < 0:
            return []  # the reply followed the first messages: the dummy user stands for them
        try:
            return normalize_messages([self._restore(session, m) for m in messages[at:]], at)
        except ValueError:
            return []

    def _normalize_and_fit(
        self, session: Session, messages: list[Any], tools: Any
    ) -> tuple[list[dict[str, Any]], int]:
        """``messages`` normalised (tool-call payloads restored) and their characters; a 413 when they cannot fit."""
        normalized = normalize_messages([self._restore(session, m) for m in messages])
        return normalized, self._check_fits(0, normalized, tools)

    def _check_fits(self, prefix_tokens: int, messages: list[dict[str, Any]], tools: Any) -> int:
        """The characters of text in ``messages`` and ``tools``; a 413 when they cannot fit the context at all."""
        chars = _text_chars(messages) + _text_chars(tools)
        least = prefix_tokens + self.renderer.min_tokens(chars)
        if self.context_length and least >= self.context_length:
            raise RouterError(
                f"the request does not fit the model: it holds at least {least} tokens; the context length is "
                f"{self.context_length}", 413, param="messages",
            )  # fmt: skip
        return chars

    async def _render(self, chars: int, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` here when the text is short, else on the render thread."""
        if chars <= INLINE_RENDER_CHARS:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._render_thread, fn, *args)

    @staticmethod
    def _restore(session: Session, message: dict[str, Any]) -> dict[str, Any]:
        """Put back the exact tool-call payloads we returned (scaffolds re-serialise arguments)."""
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if not calls or message.get("role") != "assistant":
            return message
        restored = [
            session.tool_payloads.get(c.get("id", ""), c) if isinstance(c, dict) else c for c in calls
        ]
        return {**message, "tool_calls": restored}

    def _params(self, req: ChatRequest | CompletionRequest, max_tokens: int | None) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=_top_k(req),
            stop=req.stop,
            sampling_seed=req.seed,
        )

    async def _start_chat(self, session: Session, req: ChatRequest) -> _ChatCall:
        self._check_model(req.model)
        if req.n != 1:
            raise RouterError("only n=1 is supported", 422, param="n")
        if not req.messages:
            raise RouterError("messages must not be empty", 400, param="messages")
        check_tools(req.tools)
        # a grammar is built (and checked: a 400 for what cannot be enforced) off the loop; cached per schema
        family = self.renderer.format.name  # a forced call is written in the model's own syntax
        grammar = (
            await self.off_loop(constraint, req, family) if needs_grammar(req) else constraint(req, family)
        )
        if req.chat_template_kwargs is not None and not isinstance(req.chat_template_kwargs, dict):
            raise RouterError("chat_template_kwargs must be an object", 400, param="chat_template_kwargs")
        check_tools(req.chat_template_kwargs, "chat_template_kwargs")
        tools = rendered_tools(req)
        parent, new_ids, divergence = await self._prepare_chat(session, req, tools)
        length = len(new_ids) + (len(parent.full) if parent is not None else 0)
        if self.context_length and length >= self.context_length:  # never shipped to an engine
            raise RouterError(f"the request does not fit the model: it renders to {length} tokens; the "
                              f"context length is {self.context_length}", 413, param="messages")  # fmt: skip
        # the parent's ids are shared, not copied: extending the newest call of a chain costs the new ids only
        inputs = parent.full.extend(new_ids) if parent is not None else IdSpan.of(list(new_ids))
        max_tokens = req.max_completion_tokens or req.max_tokens or self.cfg.default_max_tokens
        top_n = (req.top_logprobs or 0) if req.logprobs else 0
        call_id = f"chatcmpl-{uuid.uuid4().hex}"
        params = msgspec.structs.replace(self._params(req, max_tokens), **grammar)
        return _ChatCall(call_id, time.time(), parent, new_ids, inputs, params, top_n, tools, divergence)

    def _reply_parser(self, req: ChatRequest, call: _ChatCall) -> Any:
        """A parser of this call's reply: the family's tool calls where the request parses them (`_parses_tools`),
        its reasoning always."""
        offered = None if self.cfg.forward_unknown_tools else offered_functions(call.tools)
        loose = call.params.ebnf is not None  # the grammar wrote the call syntax, in whatever tokens
        return self.renderer.reply_parser(call.input_ids, call.tools, _parses_tools(req), offered, loose)

    def _parse_reply(self, req: ChatRequest, call: _ChatCall, gen: Generation) -> ParsedReply:
        """The whole reply parsed: what streaming it through `_reply_parser` gives, in one piece."""
        parser = self._reply_parser(req, call)
        stops = _StopFilter(req.stop)
        parser.feed(stops.feed(self.renderer.marked_reply(gen.output_ids)) + stops.finish())
        parser.finish()
        parsed: ParsedReply = parser.result()
        return parsed

    def _finish_chat(
        self,
        session: Session,
        req: ChatRequest,
        role: Role,
        call: _ChatCall,
        gen: Generation,
        parsed: ParsedReply | None = None,
    ) -> dict[str, Any]:
        """Record the call, remember it for the next turn, and build the ``chat.completion`` body.

        ``parsed`` is the reply as a stream parsed it; without it the reply is parsed here, the same way."""
        if parsed is None:
            parsed = self._parse_reply(req, call, gen)
        calls, content = parsed.tool_calls, parsed.content
        for tc in calls:
            session.tool_payloads[tc["id"]] = tc
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if parsed.reasoning:
            message["reasoning_content"] = parsed.reasoning
        if calls:
            message["tool_calls"] = calls
        self._record(
            session, call.call_id, role, call.new_ids, gen, call.submitted, call.parent, call.divergence
        )
        reply = normalize_messages([message])[0]
        turn = Turn(
            call.call_id,
            list(req.messages),
            call.tools,
            reply,
            call.inputs.extend(gen.output_ids),  # in place: the input's buffer ends with this call's input
            gen.output_ids,
        )
        session.remember(turn, extended=call.parent)
        finish = "tool_calls" if calls else _finish(gen)
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        # SGLang's field: the stop string or token id that ended the reply (None: length or abort)
        choice["matched_stop"] = (
            gen.finish_reason.get("matched") if gen.finish_reason.get("type") == "stop" else None
        )
        if req.logprobs:
            choice["logprobs"] = {
                "content": self._logprob_content(gen.output_ids, gen.logprobs, gen.top_logprobs, call.top_n)
            }
        usage: dict[str, Any] = _usage(len(call.inputs), len(gen.output_ids))
        usage["completion_tokens_details"] = {
            "reasoning_tokens": self._reasoning_tokens(gen.output_ids, parsed)
        }
        body: dict[str, Any] = {
            "id": call.call_id,
            "object": "chat.completion",
            "created": int(call.submitted),
            "model": self.model_name,
            "choices": [choice],
            "usage": usage,
            "system_fingerprint": f"gyre-w{gen.weight_version}",
        }
        if req.return_token_ids:
            body["prompt_token_ids"] = call.inputs.copy()  # O(history): only when the client asks
            choice["token_ids"] = gen.output_ids
        return body

    def _reasoning_tokens(self, output_ids: list[int], parsed: ParsedReply) -> int:
        """The reply's ids spent on reasoning: up to its closing marker where that is one token, else its text's."""
        if not parsed.reasoning:
            return 0
        reasoning = self.renderer.format.fmt.reasoning
        if reasoning is not None:
            closing = self.renderer.format.mark(reasoning[1])
            for i, text in enumerate(
                self.renderer.decode_tokens(output_ids) if closing != reasoning[1] else []
            ):
                if text == reasoning[1]:
                    return i + 1
        return len(self.renderer.encode(parsed.reasoning))

    async def chat(
        self, token: str, req: ChatRequest, role: Role = "main", control: CallControl | None = None
    ) -> dict[str, Any]:
        """One ``chat.completion``, as OpenAI returns it (plus ``prompt_token_ids``/``token_ids`` on request).

        ``control.abort()`` ends the call early: it is recorded with what was generated, finish ``abort``."""
        session = self.session(token)
        call = await self._start_chat(session, req)
        gen = await self._generate(session, call.input_ids, call.params, call.top_n, control=control)
        return self._finish_chat(session, req, role, call, gen)

    async def chat_stream(
        self, token: str, req: ChatRequest, role: Role = "main", control: CallControl | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """The same call as ``chat``, streamed as ``chat.completion.chunk`` objects while tokens arrive.

        The reply is decoded incrementally and parsed as it comes (`gyre.router.modelfamilies`): reasoning streams as
        ``reasoning_content`` deltas, content as ``content`` deltas, each tool call as one delta once its block is
        complete; text that may still open a block or a stop string is held back, and nothing sent is taken back.
        The deltas add up to ``chat``'s message for the same ids. The record and the next turn's token-exact prefix
        are those of the whole call, however many engines it took. Nothing is sent before the first token, so a
        failure before it is still an HTTP error status.
        """
        session = self.session(token)
        call = await self._start_chat(session, req)
        base = {
            "id": call.call_id,
            "object": "chat.completion.chunk",
            "created": int(call.submitted),
            "model": self.model_name,
        }
        stream = self.pool.generate_stream(call.input_ids, call.params, session.affinity, call.top_n, control)
        decoder, stops, parser = (
            self.renderer.reply_decoder(),
            _StopFilter(req.stop),
            self._reply_parser(req, call),
        )
        terminators = self.renderer.format.terminator_ids | {self.renderer.eos_token_id}
        held: list[dict[str, Any]] = []  # logprobs of ids whose text has not been sent yet
        gen: Generation | None = None
        started = False
        last: list[int] = []

        continuous = bool((req.stream_options or {}).get("continuous_usage_stats"))
        produced = 0  # ids received so far

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            entry: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            if req.logprobs and held and (delta or finish):
                entry["logprobs"] = {"content": list(held)}
                held.clear()
            out = {**base, "choices": [entry]}
            if continuous:  # vLLM's and SGLang's option: usage so far on every chunk
                out["usage"] = _usage(len(call.inputs), produced)
            return out

        def deltas(items: list[Delta]) -> Iterator[dict[str, Any]]:
            for item in items:
                if item.reasoning:
                    yield chunk({"reasoning_content": item.reasoning})
                if item.content:
                    yield chunk({"content": item.content})
                if item.tool_call is not None:
                    yield chunk({"tool_calls": [{"index": item.tool_call.index, **item.tool_call.openai()}]})

        async for item in _mapped(stream):
            if isinstance(item, Generation):
                gen = item
                break
            produced += len(item.ids)
            if not started:
                started = True
                yield chunk({"role": "assistant", "content": ""})
            if req.logprobs:
                held.extend(self._logprob_content(item.ids, item.logprobs, item.top_logprobs, call.top_n))
            # a terminator is held until more follows: as the reply's last id it is not text (`marked_reply`)
            ids, last = [*last, *item.ids], []
            if ids and ids[-1] in terminators:
                ids, last = ids[:-1], ids[-1:]
            for out in deltas(parser.feed(stops.feed(decoder.feed(ids)))):
                yield out
        assert gen is not None
        session.affinity = gen.engine
        if not started:
            yield chunk({"role": "assistant", "content": ""})
        for out in deltas(parser.feed(stops.feed(decoder.finish()) + stops.finish()) + parser.finish()):
            yield out
        parsed = parser.result()
        if produced != len(
            gen.output_ids
        ):  # the pool's chunks are the output's pieces; the record is what counts
            log.warning("call %s: streamed %d ids of %d; its message is parsed from the whole output",
                        call.call_id, produced, len(gen.output_ids))  # fmt: skip
            parsed = None
        produced = len(gen.output_ids)
        body = self._finish_chat(session, req, role, call, gen, parsed)
        final = chunk({}, body["choices"][0]["finish_reason"])
        final["choices"][0]["matched_stop"] = body["choices"][0]["matched_stop"]
        if req.return_token_ids:
            final["prompt_token_ids"], final["token_ids"] = call.inputs.copy(), gen.output_ids
        yield final
        if (req.stream_options or {}).get("include_usage"):
            yield {**base, "choices": [], "usage": body["usage"]}

    # ---- completions ----------------------------------------------------------------------------------------------
    async def complete(
        self, token: str, req: CompletionRequest, role: Role = "main", control: CallControl | None = None
    ) -> dict[str, Any]:
        """One ``text_completion`` of a raw prompt (no chat template; a new branch every time).

        The prompt is raw model input: special-token text in it is encoded as special tokens, as every
        OpenAI-compatible server does for completions."""
        session = self.session(token)
        submitted = time.time()
        self._check_model(req.model)
        if req.n != 1:
            raise RouterError("only n=1 is supported", 422, param="n")
        prompt = req.prompt
        if isinstance(prompt, list) and any(isinstance(p, str) for p in prompt):
            if len(prompt) != 1 or not isinstance(prompt[0], str):
                raise RouterError("prompt must be a text, a list of token ids, or a list holding one text", 422,
                                  param="prompt")  # fmt: skip
            text: str = prompt[0]
        elif isinstance(prompt, str):
            text = prompt
        else:
            text = ""
            if self.context_length and len(prompt) >= self.context_length:
                raise RouterError(f"the prompt has {len(prompt)} tokens; the context length is "
                                  f"{self.context_length}", 413, param="prompt")  # fmt: skip
        if text:
            least = self.renderer.min_tokens(len(text))
            if self.context_length and least >= self.context_length:
                raise RouterError(f"the prompt holds at least {least} tokens; the context length is "
                                  f"{self.context_length}", 413, param="prompt")  # fmt: skip
            input_ids = await self._render(len(text), self.renderer.encode, text)
        else:
            input_ids = [int(t) for t in prompt if not isinstance(t, str)]
        if not input_ids:
            raise RouterError("the prompt is empty", 400, param="prompt")
        gen = await self._generate(
            session, input_ids, self._params(req, req.max_tokens), req.logprobs or 0, "prompt", control
        )
        call_id = f"cmpl-{uuid.uuid4().hex}"
        self._record(session, call_id, role, input_ids, gen, submitted, None)
        text = _before_stop(self.renderer.decode(gen.output_ids), gen)
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": _finish(gen), "logprobs": None}
        if req.logprobs is not None:
            pieces = self.renderer.decode_tokens(gen.output_ids)
            choice["logprobs"] = {
                "tokens": pieces,
                "token_logprobs": gen.logprobs,
                "top_logprobs": [
                    dict(zip(self.renderer.decode_tokens([t for _, t in top]), (lp for lp, _ in top), strict=True))
                    for top in gen.top_logprobs
                ] if req.logprobs else None,
                "text_offset": _offsets(pieces),
            }  # fmt: skip
        body: dict[str, Any] = {
            "id": call_id,
            "object": "text_completion",
            "created": int(submitted),
            "model": self.model_name,
            "choices": [choice],
            "usage": _usage(len(input_ids), len(gen.output_ids)),
        }
        if req.return_token_ids:
            body["prompt_token_ids"] = input_ids
            choice["token_ids"] = gen.output_ids
        return body

    # ---- shared ---------------------------------------------------------------------------------------------------
    async def _generate(
        self,
        session: Session,
        input_ids: list[int],
        params: SamplingParams,
        top: int,
        field: str = "messages",
        control: CallControl | None = None,
    ) -> Generation:
        with _engine_errors(field):
            gen = await self.pool.generate(input_ids, params, session.affinity, top, control)
        session.affinity = gen.engine
        return gen

    def _record(
        self,
        session: Session,
        call_id: str,
        role: Role,
        new_input_ids: list[int],
        gen: Generation,
        submitted: float,
        parent: Turn | None,
        divergence: Divergence | None = None,
    ) -> CallRecord:
        finish = str(gen.finish_reason.get("type", "stop"))
        record = CallRecord(
            call_id=call_id,
            session=session.execution_id,
            role=role,
            parent_call_id=parent.call_id if parent else None,
            prefix_len=len(parent.full) if parent else 0,
            new_input_ids=new_input_ids,
            output_ids=gen.output_ids,
            output_logprobs=gen.logprobs,
            finish_reason=finish if finish in ("stop", "length", "abort") else "error",  # type: ignore[arg-type]
            weight_version=gen.weight_version,
            cell=gen.engine,
            timing=CallTiming(submitted_s=submitted, first_token_s=gen.first_token_s, finished_s=time.time()),
            # per-token versions only where a call moved across versions: most records stay one number
            output_versions=gen.versions if len(set(gen.versions)) > 1 else None,
            source=gen.source,
            divergence=divergence,
        )
        if self.journal is not None:  # journaled before the caller can see the response
            self.journal.append(record)
        session.records.append(record)
        session.calls += 1
        return record

    def _logprob_content(
        self, ids: list[int], logprobs: list[float], tops: list[list[tuple[float, int]]], top_n: int
    ) -> list[dict[str, Any]]:
        texts = self.renderer.decode_tokens(ids)
        content = []
        for i, (text, lp) in enumerate(zip(texts, logprobs, strict=True)):
            entry: dict[str, Any] = {
                "token": text,
                "logprob": lp,
                "bytes": list(text.encode()),
                "top_logprobs": [],
            }
            if top_n and i < len(tops):
                alternatives = tops[i][:top_n]
                alt_texts = self.renderer.decode_tokens([tid for _, tid in alternatives])
                entry["top_logprobs"] = [
                    {"token": t, "logprob": tlp, "bytes": list(t.encode())}
                    for t, (tlp, _) in zip(alt_texts, alternatives, strict=True)
                ]
            content.append(entry)
        return content


@dataclass
class _ChatCall:
    """A chat call between rendering and recording."""

    call_id: str
    submitted: float
    parent: Turn | None
    new_ids: list[int]
    inputs: IdSpan  # the parent's ids + new_ids; its buffer ends with them until the call is finished
    params: SamplingParams
    top_n: int
    tools: list[dict[str, Any]] | None  # as rendered: none for tool_choice "none"
    divergence: Divergence | None = None  # where the input differs from the template's canonical render

    @property
    def input_ids(self) -> list[int]:
        """The ids for the engine, not to be changed: no copy while the call is in flight (`IdSpan.ids`)."""
        return self.inputs.ids()


@contextlib.contextmanager
def _engine_errors(field: str = "messages") -> Iterator[None]:
    """Engine failures as the router's HTTP errors (``field`` names the request field a 413 is about)."""
    try:
        yield
    except EngineCapacityError as exc:
        raise RouterError(f"the request does not fit the model: {exc}", 413, param=field) from None
    except EngineRequestError as exc:
        raise RouterError(f"the engine rejected the request: {exc}", 400) from None
    except NoCapacity as exc:
        raise RouterError(str(exc), 503, "service_unavailable") from None
    except CallAborted as exc:  # the client has gone: nobody reads this
        raise RouterError(str(exc), 499, "client_closed_request") from None


async def _mapped(stream: AsyncIterator[Chunk | Generation]) -> AsyncIterator[Chunk | Generation]:
    """The pool's stream with engine failures turned into the router's HTTP errors."""
    with _engine_errors():
        async for item in stream:
            yield item


def _parses_tools(req: ChatRequest) -> bool:
    """Whether the reply's ``<tool_call>`` blocks may become tool calls: the request offered tools and did not
    say ``tool_choice: "none"`` (SGLang's rule). Records never depend on it: they keep the sampled ids."""
    return bool(req.tools) and req.tool_choice != "none"


class _StopFilter:
    """Reply text cut before the first stop string (OpenAI returns content without it), fed in any chunks: a tail
    that may become one is held back, so the pieces add up to the whole text's cut however it is chunked."""

    def __init__(self, stop: str | list[str] | None) -> None:
        self.stops = [s for s in ([stop] if isinstance(stop, str) else stop or []) if s]
        self.held, self.stopped = "", False

    def feed(self, text: str) -> str:
        if self.stopped or not self.stops:
            return "" if self.stopped else text
        text = self.held + text
        cut = min((at for at in (text.find(s) for s in self.stops) if at >= 0), default=-1)
        if cut >= 0:
            self.held, self.stopped = "", True
            return text[:cut]
        keep = max((k for s in self.stops for k in range(1, min(len(s), len(text) + 1)) if text.endswith(s[:k])),
                   default=0)  # fmt: skip
        self.held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def finish(self) -> str:
        held, self.held = self.held, ""
        return "" if self.stopped else held


def _top_k(req: ChatRequest | CompletionRequest) -> int:
    top_k = getattr(req, "top_k", None)
    return -1 if top_k is None else int(top_k)


def _without_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    """A normalized assistant message without its reasoning: a client may echo it or not, the turn is the same."""
    return (
        {k: v for k, v in message.items() if k != "reasoning_content"}
        if "reasoning_content" in message
        else message
    )


def _before_stop(text: str, gen: Generation) -> str:
    """``text`` up to the stop string that ended the call (OpenAI returns content without it)."""
    matched = gen.finish_reason.get("matched")
    if isinstance(matched, str) and matched:
        at = text.find(matched)
        if at >= 0:
            return text[:at]
    return text


def _text_chars(value: Any) -> int:
    """About the characters ``value`` takes as JSON, every node counted (strings and keys by their length, a number
    by its digits, an empty object or array by its brackets): what a chat template renders of it, at least.
    Iterative, so any depth is fine."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, dict):
            total += 2 + sum(len(k) + 4 for k in item if isinstance(k, str))
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            total += 2 + len(item)
            stack.extend(item)
        elif isinstance(item, bool) or item is None:
            total += 4
        elif isinstance(item, int):
            total += 1 if -10 < item < 10 else len(str(item)) if abs(item) < 10**100 else 101
        elif isinstance(item, float):
            total += 8
    return total


def check_tools(tools: Any, field: str = "tools") -> None:
    """Refuse (400, naming the limit) ``tools`` larger than a scaffold ever sends: more than `MAX_TOOLS` tools,
    nested deeper than `MAX_TOOLS_DEPTH`, or more than `MAX_TOOLS_NODES` JSON values in all. Iterative. ``field``:
    the request field checked (``chat_template_kwargs`` gets the same limits)."""
    if tools is None:
        return
    if len(tools) > MAX_TOOLS:
        raise RouterError(
            f"{field} holds {len(tools)} entries; at most {MAX_TOOLS} are accepted", 400, param=field
        )
    # values are counted as they are found, a whole array or object at a time, so a wide one is refused before
    # its members are looked at
    nodes, stack = 1, [(tools, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_TOOLS_DEPTH:
            raise RouterError(f"{field} is nested deeper than {MAX_TOOLS_DEPTH} levels", 400, param=field)
        if isinstance(item, dict | list):
            nodes += len(item)
            if nodes > MAX_TOOLS_NODES:
                raise RouterError(f"{field} holds more than {MAX_TOOLS_NODES} JSON values; that large is not "
                                  "accepted", 400, param=field)  # fmt: skip
            children = item.values() if isinstance(item, dict) else item
            stack.extend((v, depth + 1) for v in children if isinstance(v, dict | list))


def _model_context_length(model_path: str) -> int:
    """``max_position_embeddings`` of the model directory's config.json; 0 when there is none."""
    if not model_path:
        return 0
    try:
        with open(Path(model_path) / "config.json") as f:
            value = json.load(f).get("max_position_embeddings", 0)
    except (OSError, ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) and value > 0 else 0


def _finish(gen: Generation) -> str:
    return "length" if gen.finish_reason.get("type") == "length" else "stop"


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _offsets(pieces: list[str]) -> list[int]:
    offsets, at = [], 0
    for piece in pieces:
        offsets.append(at)
        at += len(piece)
    return offsets

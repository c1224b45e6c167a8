"""Chat messages to token ids with the model's own chat template, and sampled ids back to an assistant reply.

The router never re-tokenizes what the model produced (TITO, DESIGN.md section 5): when a request extends an
earlier call, its input ids are the earlier input ids + the sampled output ids + ``render_extension`` of only the
new messages.
Every malformed message raises ``ValueError`` naming its index and field; the caller answers HTTP 400.

Message text (content, names, tool calls and schemas) is always encoded as text: a special token's text in it (a
tool's output holding ``<|im_end|>``) becomes the ids of that text, never the special id, so nobody but the template
opens or closes a turn.

The hot path skips transformers' per-call wrappers: the chat template is compiled once and rendered on the
normalized messages, text goes straight to the Rust tokenizer, and ``render_full`` keeps an LRU cache of its
results. Each shortcut is taken only where it gives the very ids the wrapper would; ``tests/unit/router`` checks
that, and the renderer checks the template shortcut against ``apply_chat_template`` when it is made.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import jinja2
import msgspec

from gyre.errors import ConfigError
from gyre.journal.records import Divergence
from gyre.router.messages import normalize_messages
from gyre.router.modelfamilies import BoundFormat, MarkedDecoder, ParsedReply, choose_format, marked_text
from gyre.router.modelfamilies.replyparser import _MARKED

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


# The conversation render_continuation puts before the earlier reply and the new messages.
_DUMMY_PREFIX = (
    {"role": "system", "content": "gyre-dummy-system"},
    {"role": "user", "content": "gyre-dummy-user"},
)
_PROBE_REPLY = {"role": "assistant", "content": "gyre-dummy-reply"}
# render_full results kept; the executions of one RL task group send the same first messages.
_RENDER_CACHE_ENTRIES = 2048
_RENDER_CACHE_TOKENS = 1 << 20  # ids kept in all; ~36 bytes each (tuple slot + int), so ~38 MiB
_JSON_SCALARS = frozenset({str, int, bool, type(None)})  # with finite floats: tools rendered as is
_BATCH_ENCODE_CHARS = 4096  # longer texts go through encode_batch, which releases the GIL while it works


class RenderStatistics(msgspec.Struct, frozen=True):
    """What a ``ChatRenderer`` has done since it was made."""

    cache_hits: int  # render_full calls answered from the cache
    cache_misses: int  # render_full calls that rendered and encoded
    cache_entries: int  # results held now, at most the cache_entries the renderer was made with
    cache_tokens: int  # ids held now, at most the cache_tokens the renderer was made with
    slow_renders: int  # template renders through apply_chat_template instead of the compiled template


class ChatRenderer:
    """Renders chat messages with a tokenizer's chat template and parses the model's replies.

    Reads the tokenizer's template, special tokens and decoding settings once: change the tokenizer, make a new
    renderer. Not thread-safe (the caches are plain dicts); the router calls it from its event loop only.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        cache_entries: int = _RENDER_CACHE_ENTRIES,
        cache_tokens: int = _RENDER_CACHE_TOKENS,
        tool_parser: str = "",
        reasoning_parser: str = "",
    ) -> None:
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
        if cache_entries < 0 or cache_tokens < 0:
            raise ValueError(
                f"cache sizes must be >= 0, got {cache_entries} entries and {cache_tokens} tokens"
            )
        self._tokenizer = tokenizer
        self._eos_text: str = eos
        self._eos_id: int = int(tokenizer.eos_token_id)
        # render_full: digest of (tools, normalized messages) -> ids, least recently used first
        self._render_cache: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()
        self._cache_entries, self._cache_tokens, self._cached_tokens = cache_entries, cache_tokens, 0
        self._hits = self._misses = self._slow_renders = 0
        self._encoder, self._decoder = _rust_tokenizers(tokenizer)
        self._vocab_size = len(tokenizer)  # ids below it have their single-id text kept in _token_texts
        self._token_texts: dict[int, str] = {}
        self._template_kwargs: dict[str, Any] = dict(tokenizer.special_tokens_map)  # as apply_chat_template
        added_tokens = getattr(tokenizer, "added_tokens_decoder", {})
        specials = {t.content for t in added_tokens.values() if t.special}
        specials |= {t for t in tokenizer.all_special_tokens if t}
        self._added: dict[int, str] = {int(i): t.content for i, t in added_tokens.items()}
        template = tokenizer.chat_template
        template_text = (
            template if isinstance(template, str) else "\n".join(map(str, dict(template).values()))
        )
        # the family: how replies hold calls and reasoning, which ids end a turn, what history looks like
        family = choose_format(template_text, set(self._added.values()), tool_parser, reasoning_parser)
        self.format: BoundFormat = family.bind(self._added, frozenset(specials), eos)
        specials_only = {i: t for i, t in self._added.items() if t in specials}
        self._loose_format = family.bind(specials_only, frozenset(specials), eos)
        self._specials = sorted(specials, key=len, reverse=True)  # texts that encode to a special id
        self._special_re = re.compile("|".join(map(re.escape, self._specials))) if specials else None
        # encodes special-token text as plain text
        self._text_encoder: Any = _text_encoder(self._encoder) or (
            lambda text: list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
        )
        # longest text one id stands for: n characters of text are at least n / this many tokens
        self._max_token_chars = max(
            [len(t) for t in tokenizer.get_vocab()] + [len(t) for t in specials] + [1]
        )
        # tools given? -> the compiled template for that case; empty: render with apply_chat_template
        self._templates: dict[bool, jinja2.Template] = {}
        if _plain_json(list(self._template_kwargs.values())):
            self._templates = _compile_templates(tokenizer)
        if self._templates and not self._compiled_matches_wrapper():
            self._templates = {}
        self._slow_renders = 0  # the probes do not count

    @classmethod
    def from_model_dir(
        cls, path: str | Path, tool_parser: str = "", reasoning_parser: str = ""
    ) -> ChatRenderer:
        """A renderer for the tokenizer saved in a local model directory."""
        from gyre.engine.models import load_tokenizer

        return cls(load_tokenizer(path), tool_parser=tool_parser, reasoning_parser=reasoning_parser)

    @property
    def eos_text(self) -> str:
        """The text of the token that ends an assistant turn."""
        return self._eos_text

    @property
    def eos_token_id(self) -> int:
        """The id of the token that ends an assistant turn."""
        return self._eos_id

    def statistics(self) -> RenderStatistics:
        """Cache and slow-path counters since the renderer was made."""
        return RenderStatistics(
            cache_hits=self._hits,
            cache_misses=self._misses,
            cache_entries=len(self._render_cache),
            cache_tokens=self._cached_tokens,
            slow_renders=self._slow_renders,
        )

    def min_tokens(self, chars: int) -> int:
        """A lower bound on the tokens of any text of ``chars`` characters."""
        return chars // self._max_token_chars

    def render_full(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Ids of the whole conversation followed by the generation prompt; a new list the caller may change.

        ``kwargs`` are the request's ``chat_template_kwargs`` (Qwen3's ``enable_thinking``, DeepSeek's
        ``thinking``), passed to the template as SGLang and vLLM pass them."""
        key, ids = self.cached_render(messages, tools, kwargs)
        if ids is None:
            ids = self.render_uncached(messages, tools, kwargs)
            self.remember_render(key, ids)
        return ids

    def cached_render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> tuple[bytes | None, list[int] | None]:
        """``render_full``'s cache key for these messages (None: not cacheable) and its cached ids, if any."""
        normalized = normalize_messages(messages)
        cacheable = _plain_tools(tools) and _plain_tools([kwargs or {}]) and self._cache_entries
        key = _digest([tools, kwargs or {}], normalized) if cacheable else None
        if key is not None and (cached := self._render_cache.get(key)) is not None:
            self._render_cache.move_to_end(key)
            self._hits += 1
            return key, list(cached)
        self._misses += 1
        return key, None

    def render_uncached(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """``render_full`` without its cache; safe to call from another thread (it touches no cache)."""
        normalized = normalize_messages(messages)
        plain = _plain_tools(tools) and _plain_tools([kwargs or {}])
        # special-token text in the kwargs' strings is text too: a request cannot forge a turn through them
        marked, encode = self._marked([normalized, tools, kwargs or {}])
        return encode(self._template(marked[0], marked[1], True, plain, marked[2]))

    def remember_render(self, key: bytes | None, ids: list[int]) -> None:
        """Keep ``ids`` as ``render_full``'s result for ``key`` (from ``cached_render``)."""
        if key is not None and len(ids) <= self._cache_tokens:
            self._render_cache[key] = tuple(ids)
            self._cached_tokens += len(ids)
            while len(self._render_cache) > self._cache_entries or self._cached_tokens > self._cache_tokens:
                self._cached_tokens -= len(self._render_cache.popitem(last=False)[1])

    def _marked(self, values: list[Any]) -> tuple[list[Any], Any]:
        """``values`` with special-token text in their strings swapped for markers, and the function encoding a
        template's text of them: each marker becomes its text's plain ids, so only the template writes special
        tokens."""
        if self._special_re is None or not _mentions(self._special_re, values):
            return values, self._encode
        nonce = secrets.token_hex(8)
        found: list[str] = []

        def mark(match: re.Match[str]) -> str:
            found.append(match.group())
            return f"\ue000{nonce}{len(found) - 1}\ue001"

        pattern = self._special_re
        marked = _map_strings(values, lambda text: pattern.sub(mark, text))
        split = re.compile(f"\ue000{nonce}(\\d+)\ue001")

        def encode(text: str) -> list[int]:
            ids: list[int] = []
            for i, piece in enumerate(split.split(text)):
                if i % 2:
                    ids += self._text_encoder(found[int(piece)])
                elif piece:
                    ids += self._encode(piece)
            return ids

        return marked, encode

    def render_continuation(
        self,
        reply: dict[str, Any],
        new_messages: list[dict[str, Any]],
        output_ids: list[int],
        tools: list[dict[str, Any]] | None = None,
        kwargs: dict[str, Any] | None = None,
        context: list[dict[str, Any]] | None = None,
    ) -> tuple[list[int], Divergence | None]:
        """Ids of only ``new_messages`` as they follow the earlier call whose reply was ``output_ids``, ending with
        the generation prompt; and where the template's own render of that reply turn differs from the ids the
        model produced (None: it does not).

        The earlier ids are kept as they are (what the model was served is what it is trained on): the template
        renders a short conversation ending with ``reply`` (the earlier call's normalised message) and the new
        messages, and only what follows the reply's turn is taken, cut at the family's terminator. A reply that
        did not end with a terminator (length, a stop string) gets the template's terminator appended: it is
        context now. ``context``: the normalised messages just before the reply (from the turn before it), so the
        reply renders as it does in the conversation (DeepSeek writes a reply after a tool output otherwise than
        after a user message). Raises ``ValueError`` when the template shows no turn boundary after the reply.
        """
        new = normalize_messages(new_messages)
        plain = _plain_tools(tools) and _plain_tools([kwargs or {}])
        before = list(context or [])
        marked, encode = self._marked([[*_DUMMY_PREFIX, *before, reply, *new], tools, kwargs or {}])
        convo, marked_tools, kwargs = marked
        head = convo[: len(_DUMMY_PREFIX) + len(before)]
        marked_reply = convo[len(head)]
        whole = self._template(convo, marked_tools, True, plain, kwargs)
        alone = self._template([*head, marked_reply], marked_tools, False, plain, kwargs)
        fmt = self.format
        closing = (*fmt.closing_texts, *([self._eos_text] if self._eos_text not in fmt.closing_texts else []))
        # where the reply's own text is, past the dummy user's: the boundary cannot come before it
        start = self._template(head, marked_tools, True, plain, kwargs)
        user_at = len(start) if whole.startswith(start) else whole.find(_DUMMY_PREFIX[1]["content"])
        anchor = (marked_reply.get("content") or "").strip()[:32]
        reply_at = whole.find(anchor, user_at) if anchor and user_at >= 0 else -1
        cut, terminator, opens = _turn_end(alone, whole, closing, fmt.opening_texts, max(reply_at, 0))
        last = self.decode_tokens([output_ids[-1]])[0] if output_ids else ""
        ended = bool(output_ids) and output_ids[-1] in fmt.terminator_ids | {self._eos_id}
        appended: list[int] = []
        if opens:  # GLM: the reply's last id opens the next turn, which the template writes first
            skip = ended and last == terminator
            ids = encode(whole[cut + len(terminator) :] if skip else whole[cut:])
        else:
            ids = encode(whole[cut:])
            appended = [] if ended else encode(terminator)
        # the template's own render of the reply's turn, against the ids the model produced
        divergence = None
        at = (
            len(start)
            if whole.startswith(start)
            else self._reply_start(
                whole, cut, start, self._template(head, marked_tools, False, plain, kwargs)
            )
        )
        if 0 <= at <= cut:
            canonical = encode(whole[at:cut])
            produced = list(output_ids) + appended
            if opens and ended:
                produced = produced[:-1]
            divergence = self._divergence(canonical, produced)
        return appended + ids, divergence

    @staticmethod
    def _reply_start(whole: str, cut: int, prompt: str, bare: str) -> int:
        """Where the reply's turn starts in ``whole`` when the messages before it render otherwise once more follow
        (Qwen3 drops the earlier turn's reasoning): after the last generation prompt before ``cut`` (``prompt`` less
        ``bare``: the messages before the reply with and without it); -1 if none."""
        opening = prompt[len(bare) :] if prompt.startswith(bare) else ""
        found = whole.rfind(opening, 0, cut) if opening else -1
        return found + len(opening) if found >= 0 else -1

    def _divergence(self, canonical: list[int], produced: list[int]) -> Divergence | None:
        """How the produced ids of a reply turn differ from the template's render of it; None when they don't."""
        if canonical == produced:
            return None
        at = next((i for i, (a, b) in enumerate(zip(canonical, produced, strict=False)) if a != b),
                  min(len(canonical), len(produced)))  # fmt: skip
        texts = self._decode(canonical, False), self._decode(produced, False)
        ends = self.format.terminator_ids | {i for i, t in self._added.items() if t in self.format.specials}
        closing = self.format.fmt.reasoning[1] if self.format.fmt.reasoning else None
        kind: Literal["reasoning", "terminator", "tokenization", "render"]
        if texts[0] == texts[1]:
            kind = "tokenization"  # the same text, split into other ids
        elif (
            canonical
            and produced
            and canonical[:-1] == produced[:-1]
            and {canonical[-1], produced[-1]} <= ends
        ):
            kind = "terminator"  # gpt-oss: <|return|> sampled, <|end|> in history
        elif (
            closing is not None
            and closing in texts[1]
            and _after(texts[1], closing) == _after(texts[0], closing)
        ):
            kind = "reasoning"  # the template drops (or empties) the reasoning of earlier turns
        else:
            kind = "render"
        return Divergence(kind=kind, index=at)

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text (no template, no special tokens added)."""
        return self._encode(text)

    def decode(self, ids: list[int]) -> str:
        """Text of token ids, special tokens included (for completions; see ``decode_tokens`` for logprobs)."""
        if len(ids) == 1:
            return self.decode_tokens(ids)[0]
        return self._decode(ids, skip_special_tokens=False)

    def decode_tokens(self, ids: list[int]) -> list[str]:
        """The text of each id on its own, special tokens included: ``[decode([i]) for i in ids]`` in one call."""
        texts = self._token_texts  # every id in the vocabulary decodes to one fixed text; learnt on first use
        try:
            return [texts[i] for i in ids]
        except KeyError:
            pass
        out: list[str] = []
        for i in ids:
            text = texts.get(i)
            if text is None:
                text = self._decode([i], skip_special_tokens=False)
                if 0 <= i < self._vocab_size:  # ids past it are not kept: texts stays bounded
                    texts[i] = text
            out.append(text)
        return out

    def parse_output(
        self,
        output_ids: list[int],
        tools: list[dict[str, Any]] | None = None,
        prompt_ids: list[int] | None = None,
    ) -> ParsedReply:
        """Decode sampled ids into content, reasoning and the family's tool calls; never raises on bad output."""
        parser = self.reply_parser(prompt_ids or [], tools)
        parser.feed(self.marked_reply(output_ids))
        parser.finish()
        result: ParsedReply = parser.result()
        return result

    def reply_parser(
        self,
        prompt_ids: list[int],
        tools: list[dict[str, Any]] | None = None,
        parse_tools: bool = True,
        offered: Any = None,
        loose: bool = False,
    ) -> Any:
        """A parser of one reply to ``prompt_ids`` (the family's `ReplyParser`), fed marked text.

        The reply starts inside reasoning when the prompt's generation prompt opened it (DeepSeek-R1's ``<think>``,
        Qwen3's forced thinking). ``loose``: markers that are not special tokens also match as text, for replies a
        grammar forced into the family's call syntax (the grammar allows any tokenization of it)."""
        in_reasoning = False
        if self.format.reasoning is not None and prompt_ids:
            tail = marked_text(self._plain_decode, self._added, list(prompt_ids[-24:]))
            opening, closing = self.format.reasoning
            in_reasoning = tail.rfind(opening) > tail.rfind(closing)
        if loose:
            return _Loose(
                self._loose_format.parser(
                    tools=tools, parse_tools=parse_tools, offered=offered, in_reasoning=in_reasoning
                ),
                self.format.specials,
            )
        return self.format.parser(
            tools=tools, parse_tools=parse_tools, offered=offered, in_reasoning=in_reasoning
        )

    def reply_decoder(self) -> MarkedDecoder:
        """An incremental decoder of one reply's ids into marked text (`gyre.router.modelfamilies.marked`)."""
        return MarkedDecoder(self._plain_decode, self._added)

    def marked_reply(self, output_ids: list[int]) -> str:
        """A whole reply's marked text, without the terminator that ended it."""
        ids = list(output_ids)
        if ids and ids[-1] in self.format.terminator_ids | {self._eos_id}:
            ids.pop()
        return marked_text(self._plain_decode, self._added, ids)

    def _plain_decode(self, ids: list[int]) -> str:
        return self._decode(ids, skip_special_tokens=False)

    def _template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        plain_tools: bool,
        kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The template's text for normalized ``messages``; ``plain_tools`` is ``_plain_tools(tools)``.

        Messages reach the template in the family's history form (`_history`); ``kwargs`` are the request's
        ``chat_template_kwargs``, which may not replace what the template is always given."""
        if tools is not None and not isinstance(tools, list):
            raise ValueError(f"tools must be a list of tool objects, got {type(tools).__name__}")
        extra = dict(kwargs or {})
        clash = sorted(set(extra) & {"messages", "tools", "documents", "add_generation_prompt", "tokenize"})
        if clash:
            raise ValueError(f"chat_template_kwargs may not set {', '.join(clash)}")
        messages = self._history(messages)
        compiled = self._templates.get(tools is not None) if plain_tools and messages else None
        try:
            if compiled is not None:
                # What apply_chat_template renders once it has copied these plain messages and tools.
                return compiled.render(
                    messages=messages,
                    tools=tools,
                    documents=None,
                    add_generation_prompt=add_generation_prompt,
                    **{**self._template_kwargs, **extra},
                )
            self._slow_renders += 1
            schemas: list[Any] | None = tools  # passed through unchanged, as OpenAI clients send them
            text = self._tokenizer.apply_chat_template(
                messages,
                tools=schemas,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **extra,
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

    def _history(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Normalized messages as the family's template wants them: reasoning under its key, tool-call arguments
        as objects or strings, tool-call ids in the form it accepts. The others are passed as they are."""
        fmt = self.format.fmt
        rename = fmt.reasoning_field != "reasoning_content"
        objects, ids = fmt.history_arguments == "object", fmt.call_ids == "mistral"
        out = messages
        for i, message in enumerate(messages):
            role = message.get("role")
            changed: dict[str, Any] | None = None
            if role == "assistant" and rename and "reasoning_content" in message:
                changed = {k: v for k, v in message.items() if k != "reasoning_content"}
                changed[fmt.reasoning_field] = message["reasoning_content"]
                if fmt.custom == "harmony" and changed.get("tool_calls") and changed.get("content"):
                    changed["content"] = ""  # gpt-oss's template writes one analysis message before a call
            if role == "assistant" and (objects or ids) and message.get("tool_calls"):
                changed = dict(changed or message)
                changed["tool_calls"] = [_history_call(fmt, c, objects) for c in message["tool_calls"]]
            elif role == "tool" and ids and isinstance(message.get("tool_call_id"), str):
                changed = {**message, "tool_call_id": fmt.history_call_id(message["tool_call_id"])}
            if changed is not None:
                if out is messages:
                    out = list(messages)
                out[i] = changed
        return out

    def _compiled_matches_wrapper(self) -> bool:
        """Whether the compiled template renders probe conversations exactly as ``apply_chat_template`` does.

        Guards against a transformers release that passes the template more than this module does.
        """
        tools = [
            {"type": "function", "function": {"name": "gyre_probe", "description": "p", "parameters": {}}}
        ]
        probes = [([*_DUMMY_PREFIX, _PROBE_REPLY], None, False), (list(_DUMMY_PREFIX), tools, True)]
        for messages, probe_tools, generation_prompt in probes:
            results = []
            for plain in (True, False):
                try:
                    results.append(
                        self._template(messages, probe_tools, generation_prompt, plain_tools=plain)
                    )
                except Exception as error:  # a template may refuse a probe: then it must refuse it both ways
                    results.append(type(error).__name__)
            if results[0] != results[1]:
                return False
        return True

    def _encode(self, text: str) -> list[int]:
        # transformers' encode first resets the backend's truncation, padding and special-token splitting, which
        # another caller of the same tokenizer may have set; only then is the wrapper needed.
        backend = self._encoder
        if (
            backend is not None
            and type(text) is str
            and backend.truncation is None
            and backend.padding is None
            and backend.encode_special_tokens == self._tokenizer.split_special_tokens
        ):
            if len(text) > _BATCH_ENCODE_CHARS:  # the same ids; the GIL is released meanwhile
                return list(backend.encode_batch([text], add_special_tokens=False)[0].ids)
            return list(backend.encode(text, add_special_tokens=False).ids)
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        if self._decoder is not None and type(ids) is list:
            return str(self._decoder.decode(ids, skip_special_tokens=skip_special_tokens))
        text = self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        if not isinstance(text, str):
            raise TypeError(f"decode returned {type(text).__name__}, not str")
        return text


def _mentions(pattern: re.Pattern[str], value: Any) -> bool:
    """Whether any string (key or value) in a JSON-like value matches ``pattern``."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if pattern.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(k for k in item if isinstance(k, str))
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def _map_strings(value: Any, fn: Any) -> Any:
    """A copy of a JSON-like value with ``fn`` applied to every string, keys included."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {(fn(k) if isinstance(k, str) else k): _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_map_strings(v, fn) for v in value]
    return value


def _text_encoder(backend: Any) -> Any:
    """A function encoding text with special-token text taken as plain text (a private copy of the backend)."""
    if backend is None:
        return None
    from tokenizers import Tokenizer

    plain = Tokenizer.from_str(backend.to_str())
    plain.encode_special_tokens = True
    plain.no_truncation()
    plain.no_padding()
    return lambda text: list(plain.encode(text, add_special_tokens=False).ids)


def _plain_tools(tools: Any) -> bool:
    """Whether ``tools`` is None or a list of dicts holding only exact JSON types, string keys and finite floats.

    Such tools reach the template as they are (transformers would only copy them) and their msgspec encoding
    identifies them (a NaN would encode as null, a subclass as its base), so they may key a cache.
    """
    if tools is None:
        return True
    return type(tools) is list and all(type(tool) is dict for tool in tools) and _plain_json(tools)


def _plain_json(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            if any(type(key) is not str for key in item):
                return False
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind not in _JSON_SCALARS:
            return False
    return True


def _digest(tools: Any, messages: list[dict[str, Any]]) -> bytes | None:
    """A digest of plain tools and normalized messages, key order included (tojson keeps it); None if unencodable."""
    try:
        encoded = msgspec.json.encode([tools, messages])
    except (msgspec.EncodeError, ValueError, TypeError, RecursionError):  # lone surrogates, depth: not cached
        return None
    return hashlib.blake2b(encoded, digest_size=16, person=b"gyre-render").digest()


def _compile_templates(tokenizer: PreTrainedTokenizerBase) -> dict[bool, jinja2.Template]:
    """The tokenizer's template compiled as transformers compiles it, for calls without and with tools.

    Empty when transformers' private compile function is missing or fails, or the tokenizer renders its own way:
    then every render goes through ``apply_chat_template``.
    """
    try:
        from transformers import PreTrainedTokenizerBase as Base
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        return {}
    if getattr(type(tokenizer), "apply_chat_template", None) is not Base.apply_chat_template:
        return {}
    templates: dict[bool, jinja2.Template] = {}
    for with_tools in (False, True):
        try:  # a dict of named templates picks "tool_use" when tools are given
            source = tokenizer.get_chat_template(None, [] if with_tools else None)
            compiled = _compile_jinja_template(source)
        except Exception:  # private API, or a template that does not compile: apply_chat_template reports it
            continue
        if isinstance(compiled, jinja2.Template):
            templates[with_tools] = compiled
    return templates


def _rust_tokenizers(tokenizer: PreTrainedTokenizerBase) -> tuple[Any, Any]:
    """The Rust tokenizer to encode with and the one to decode with, each None where transformers' path differs.

    A fast tokenizer's ``encode`` and ``decode`` only reset backend settings, then call the Rust tokenizer (and
    for decode, optionally clean up spaces); a subclass that overrides either keeps its own path.
    """
    try:
        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerBase as Base
        from transformers import PreTrainedTokenizerFast as Fast
    except ImportError:
        return None, None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        return None, None
    cls = type(tokenizer)
    encoder = (
        backend
        if cls.encode is Base.encode
        and getattr(cls, "_encode_plus", None) is getattr(Fast, "_encode_plus", False)
        and isinstance(getattr(tokenizer, "split_special_tokens", None), bool)
        else None
    )
    decoder = (
        backend
        if cls.decode is Base.decode
        and getattr(cls, "_decode", None) is getattr(Fast, "_decode", False)
        and not getattr(tokenizer, "clean_up_tokenization_spaces", True)
        else None
    )
    return encoder, decoder


def _after(text: str, marker: str) -> str:
    """``text`` after the last ``marker`` in it (all of it without one), leading whitespace dropped."""
    return (text[text.rfind(marker) + len(marker) :] if marker in text else text).lstrip()


def _history_call(fmt: Any, call: dict[str, Any], objects: bool) -> dict[str, Any]:
    """A normalized tool call in the family's history form."""
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if objects and isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, dict):
            arguments = value
    out = {**call, "function": {**function, "arguments": arguments}}
    if isinstance(call.get("id"), str):
        out["id"] = fmt.history_call_id(call["id"])
    return out


def _turn_end(
    alone: str, whole: str, closing: tuple[str, ...], opening: tuple[str, ...], reply_at: int = 0
) -> tuple[int, str, bool]:
    """Where the reply's turn ends in ``whole`` (a conversation through the reply and the new messages), given
    ``alone`` (the same conversation ending with the reply): the offset, the terminator found and whether it opens
    the next turn (the cut is before it) rather than closing the reply's (the cut is after it).

    Where ``alone`` is a prefix of ``whole`` the reply's turn ends with ``alone``'s last closing terminator (or, with
    none there, at ``alone``'s end, before the opener that follows). Otherwise the template renders the reply
    differently once messages follow (Qwen3 drops an empty think block; gpt-oss writes <|end|> for <|return|>): the
    turn ends at the first terminator that reaches past the texts' common prefix and the reply's text at
    ``reply_at``."""
    if whole.startswith(alone):
        tail = alone.rstrip()
        for text in closing:
            if tail.endswith(text):
                return len(tail), text, False
        rest = whole[len(alone) :]
        for text in opening:
            if rest.startswith(text):
                return len(alone), text, True
        raise ValueError("the chat template writes no turn terminator after the reply")
    common = 0
    for a, b in zip(alone, whole, strict=False):
        if a != b:
            break
        common += 1
    longest = max((len(t) for t in (*closing, *opening)), default=0)
    found: list[
        tuple[int, str, bool]
    ] = []  # (start, text, opens) of the first terminator reaching past `common`
    for texts, opens in ((closing, False), (opening, True)):
        for text in texts:
            at = whole.find(text, max(0, common - longest, reply_at))
            while at >= 0 and at + len(text) <= common:
                at = whole.find(text, at + 1)
            if at >= 0:
                found.append((at, text, opens))
    best = min(found, default=None)
    if best is None:
        raise ValueError("the chat template writes no turn terminator after the reply")
    start, text, opens = best
    return (start if opens else start + len(text)), text, opens


class _Loose:
    """A reply parser fed marked text whose added tokens that are not special are plain text first."""

    def __init__(self, parser: Any, specials: frozenset[str]) -> None:
        self.parser, self.specials = parser, specials

    def feed(self, text: str) -> Any:
        return self.parser.feed(_MARKED.sub(self._plain, text))

    def finish(self) -> Any:
        return self.parser.finish()

    def result(self) -> ParsedReply:
        result: ParsedReply = self.parser.result()
        return result

    def _plain(self, match: re.Match[str]) -> str:
        return match.group(0) if match.group(1) in self.specials else match.group(1)

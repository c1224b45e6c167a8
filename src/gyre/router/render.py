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

import contextlib
import hashlib
import math
import re
import secrets
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import msgspec

from gyre.errors import ConfigError
from gyre.router.messages import (
    TOOL_CALL_OPEN,
    ParsedReply,
    normalize_messages,
    parse_tool_calls,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


# The conversation render_extension puts before the new messages; the reply text marks the assistant turn.
_DUMMY_REPLY = "gyre-dummy-reply"
_DUMMY_PREFIX = (
    {"role": "system", "content": "gyre-dummy-system"},
    {"role": "user", "content": "gyre-dummy-user"},
    {"role": "assistant", "content": _DUMMY_REPLY},
)
_PREFIX_CACHE_ENTRIES = 64  # distinct tool lists whose dummy-prefix render is kept
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
        # tools digest -> the dummy conversation's text up to its reply's eos marker
        self._prefix_cache: dict[bytes, str] = {}
        # render_full: digest of (tools, normalized messages) -> ids, least recently used first
        self._render_cache: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()
        self._cache_entries, self._cache_tokens, self._cached_tokens = cache_entries, cache_tokens, 0
        self._hits = self._misses = self._slow_renders = 0
        self._encoder, self._decoder = _rust_tokenizers(tokenizer)
        self._vocab_size = len(tokenizer)  # ids below it have their single-id text kept in _token_texts
        self._token_texts: dict[int, str] = {}
        self._template_kwargs: dict[str, Any] = dict(tokenizer.special_tokens_map)  # as apply_chat_template
        specials = {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special}
        specials |= {t for t in tokenizer.all_special_tokens if t}
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
    def from_model_dir(cls, path: str | Path) -> ChatRenderer:
        """A renderer for the tokenizer saved in a local model directory."""
        from gyre.engine.models import load_tokenizer

        return cls(load_tokenizer(path))

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
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Ids of the whole conversation followed by the generation prompt; a new list the caller may change."""
        key, ids = self.cached_render(messages, tools)
        if ids is None:
            ids = self.render_uncached(messages, tools)
            self.remember_render(key, ids)
        return ids

    def cached_render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> tuple[bytes | None, list[int] | None]:
        """``render_full``'s cache key for these messages (None: not cacheable) and its cached ids, if any."""
        normalized = normalize_messages(messages)
        key = _digest(tools, normalized) if _plain_tools(tools) and self._cache_entries else None
        if key is not None and (cached := self._render_cache.get(key)) is not None:
            self._render_cache.move_to_end(key)
            self._hits += 1
            return key, list(cached)
        self._misses += 1
        return key, None

    def render_uncached(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """``render_full`` without its cache; safe to call from another thread (it touches no cache)."""
        normalized = normalize_messages(messages)
        plain = _plain_tools(tools)
        return self._render_ids(normalized, tools, plain, lambda text: text, add_generation_prompt=True)

    def remember_render(self, key: bytes | None, ids: list[int]) -> None:
        """Keep ``ids`` as ``render_full``'s result for ``key`` (from ``cached_render``)."""
        if key is not None and len(ids) <= self._cache_tokens:
            self._render_cache[key] = tuple(ids)
            self._cached_tokens += len(ids)
            while len(self._render_cache) > self._cache_entries or self._cached_tokens > self._cache_tokens:
                self._cached_tokens -= len(self._render_cache.popitem(last=False)[1])

    def _render_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        plain: bool,
        cut: Any,
        add_generation_prompt: bool,
    ) -> list[int]:
        """Ids of ``cut(template text)``, with special-token text from messages and tools encoded as text.

        Such text is swapped for a marker before rendering, and the marker for the text's plain ids after."""
        if self._special_re is None or not _mentions(self._special_re, [messages, tools]):
            return self._encode(cut(self._template(messages, tools, add_generation_prompt, plain)))
        nonce = secrets.token_hex(8)
        found: list[str] = []

        def mark(match: re.Match[str]) -> str:
            found.append(match.group())
            return f"\ue000{nonce}{len(found) - 1}\ue001"

        pattern = self._special_re
        marked = _map_strings([messages, tools], lambda text: pattern.sub(mark, text))
        text = cut(self._template(marked[0], marked[1], add_generation_prompt, plain))
        ids: list[int] = []
        pieces = re.split(f"\ue000{nonce}(\\d+)\ue001", text)
        for i, piece in enumerate(pieces):
            if i % 2:
                ids += self._text_encoder(found[int(piece)])
            elif piece:
                ids += self._encode(piece)
        return ids

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
        plain = _plain_tools(tools)
        prefix = self._dummy_prefix(tools, plain)

        def cut(text: str) -> str:
            if not text.startswith(prefix):
                raise ValueError(
                    "the chat template renders earlier turns differently once new messages follow"
                )
            delta = text[len(prefix) :]
            return delta if previous_ended_with_eos else self._eos_text + delta

        return self._render_ids([*_DUMMY_PREFIX, *new], tools, plain, cut, add_generation_prompt=True)

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

    def parse_output(self, output_ids: list[int]) -> ParsedReply:
        """Decode sampled ids into content and Hermes-style ``<tool_call>`` tool calls; never raises on bad output."""
        return parse_tool_calls(self.reply_text(output_ids))

    def reply_text(self, output_ids: list[int]) -> str:
        """The sampled reply as text: without its closing eos token and without special tokens."""
        ids = list(output_ids)
        if ids and ids[-1] == self._eos_id:
            ids.pop()
        return self._decode(ids, skip_special_tokens=True)

    def streamable_content(self, output_ids: list[int], hold_tool_calls: bool = True) -> str:
        """The part of a reply still being generated that can be streamed as content without taking it back.

        Stops before a ``<tool_call>`` block (and holds back a tail that may be the start of one), before an
        incomplete UTF-8 sequence, and before trailing whitespace; leading whitespace is dropped. The streamed text
        is so always a prefix of the final message content when no text follows the tool calls.
        """
        text = self.reply_text(output_ids)
        if hold_tool_calls:
            at = text.find(TOOL_CALL_OPEN)
            if at >= 0:
                text = text[:at]
            else:
                for k in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
                    if text.endswith(TOOL_CALL_OPEN[:k]):
                        text = text[:-k]
                        break
        return text.rstrip("\ufffd").strip()

    def _dummy_prefix(self, tools: list[dict[str, Any]] | None, plain_tools: bool) -> str:
        """The dummy conversation's text up to and including its assistant reply's eos marker."""
        key = _digest(tools, []) if plain_tools else None
        cached = self._prefix_cache.get(key) if key is not None else None
        if cached is not None:
            return cached
        text = self._template(
            list(_DUMMY_PREFIX), tools, add_generation_prompt=False, plain_tools=plain_tools
        )
        end, reply_at = text.rfind(self._eos_text), text.rfind(_DUMMY_REPLY)
        if reply_at < 0 or end < reply_at:
            raise ValueError(
                f"the chat template does not end an assistant turn with the eos text {self._eos_text!r}"
            )
        prefix = text[: end + len(self._eos_text)]
        if key is not None:
            # the render thread may add one at the same time: a lost or doubled eviction is harmless
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                if len(self._prefix_cache) >= _PREFIX_CACHE_ENTRIES:
                    self._prefix_cache.pop(next(iter(self._prefix_cache)), None)  # oldest first
            self._prefix_cache[key] = prefix
        return prefix

    def _template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        plain_tools: bool,
    ) -> str:
        """The template's text for normalized ``messages``; ``plain_tools`` is ``_plain_tools(tools)``."""
        if tools is not None and not isinstance(tools, list):
            raise ValueError(f"tools must be a list of tool objects, got {type(tools).__name__}")
        compiled = self._templates.get(tools is not None) if plain_tools and messages else None
        try:
            if compiled is not None:
                # What apply_chat_template renders once it has copied these plain messages and tools.
                return compiled.render(
                    messages=messages,
                    tools=tools,
                    documents=None,
                    add_generation_prompt=add_generation_prompt,
                    **self._template_kwargs,
                )
            self._slow_renders += 1
            schemas: list[Any] | None = tools  # passed through unchanged, as OpenAI clients send them
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

    def _compiled_matches_wrapper(self) -> bool:
        """Whether the compiled template renders probe conversations exactly as ``apply_chat_template`` does.

        Guards against a transformers release that passes the template more than this module does.
        """
        tools = [
            {"type": "function", "function": {"name": "gyre_probe", "description": "p", "parameters": {}}}
        ]
        probes = [(list(_DUMMY_PREFIX), None, False), (list(_DUMMY_PREFIX[:2]), tools, True)]
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


def _digest(tools: list[dict[str, Any]] | None, messages: list[dict[str, Any]]) -> bytes | None:
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

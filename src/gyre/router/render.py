"""Chat messages to token ids with the model's own chat template, and sampled ids back to an assistant reply.

The router never re-tokenizes what the model produced (TITO, DESIGN.md section 5): when a request extends an
earlier call, its input ids are the earlier input ids + the sampled output ids + ``render_extension`` of only the
new messages.
Every malformed message raises ``ValueError`` naming its index and field; the caller answers HTTP 400.

The hot path skips transformers' per-call wrappers: the chat template is compiled once and rendered on the
normalized messages, text goes straight to the Rust tokenizer, and ``render_full`` keeps an LRU cache of its
results. Each shortcut is taken only where it gives the very ids the wrapper would; ``tests/unit/router`` checks
that, and the renderer checks the template shortcut against ``apply_chat_template`` when it is made.
"""

from __future__ import annotations

import hashlib
import math
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

    def statistics(self) -> RenderStatistics:
        """Cache and slow-path counters since the renderer was made."""
        return RenderStatistics(
            cache_hits=self._hits,
            cache_misses=self._misses,
            cache_entries=len(self._render_cache),
            cache_tokens=self._cached_tokens,
            slow_renders=self._slow_renders,
        )

    def render_full(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Ids of the whole conversation followed by the generation prompt; a new list the caller may change."""
        normalized = normalize_messages(messages)
        plain = _plain_tools(tools)
        key = _digest(tools, normalized) if plain and self._cache_entries else None
        if key is not None and (cached := self._render_cache.get(key)) is not None:
            self._render_cache.move_to_end(key)
            self._hits += 1
            return list(cached)
        self._misses += 1
        ids = self._encode(self._template(normalized, tools, add_generation_prompt=True, plain_tools=plain))
        if key is not None and len(ids) <= self._cache_tokens:
            self._render_cache[key] = tuple(ids)
            self._cached_tokens += len(ids)
            while len(self._render_cache) > self._cache_entries or self._cached_tokens > self._cache_tokens:
                self._cached_tokens -= len(self._render_cache.popitem(last=False)[1])
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
        text = self._template([*_DUMMY_PREFIX, *new], tools, add_generation_prompt=True, plain_tools=plain)
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
            if len(self._prefix_cache) >= _PREFIX_CACHE_ENTRIES:
                self._prefix_cache.pop(next(iter(self._prefix_cache)))  # oldest first
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
            return list(backend.encode(text, add_special_tokens=False).ids)
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        if self._decoder is not None and type(ids) is list:
            return str(self._decoder.decode(ids, skip_special_tokens=skip_special_tokens))
        text = self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        if not isinstance(text, str):
            raise TypeError(f"decode returned {type(text).__name__}, not str")
        return text


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

"""Grammar-constrained decoding with xgrammar: compile a request's constraint, then mask its logits at every step.

A request may carry one constraint (``SamplingParams.json_schema``, ``regex`` or ``ebnf``, SGLang's names). The engine
compiles it on a worker thread (never on the event loop, never on the engine thread) before the request is queued, so
a constraint xgrammar refuses is a 400 naming what was wrong, and a compiled grammar is cached by its text. xgrammar is
imported on the first constrained request: unconstrained serving never pays for it.

Ownership: `Grammars` belongs to one engine. Its compiler is shared by worker threads (xgrammar's compiler is
thread-safe); a request's `GrammarMatcher` and the bitmask buffer belong to the engine thread once the request is
queued. Invariant: a matcher has accepted exactly the request's output ids (retraction keeps the ids, so re-prefill
needs no rollback).

What the mask does to the behaviour logprobs: on a constrained row, every token the grammar does not allow next gets
logit -inf before anything else (min_new_tokens, temperature, top-k/top-p/min-p). The sampled token is therefore always
allowed, and the logprob recorded for it is under the distribution it was actually drawn from: the temperature-scaled
softmax renormalised over the allowed tokens, ``log p(t) - log sum_{a allowed} p(a)`` (0 where the grammar allows one
token). It is >= the unmasked logprob the trainer recomputes; the difference is the log of the mass the grammar let
through.

End of output: the grammar allows the engine's end-of-sequence ids (the model's ``eos_token_id``s) only once the text
is complete, so a constrained request ends with "stop" on a complete match, or with "length" at ``max_new_tokens``
(its output is then incomplete, as SGLang's).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from gyre.errors import EngineRequestError

if TYPE_CHECKING:
    import xgrammar

KINDS = ("json_schema", "regex", "ebnf")
_CACHE_BYTES = 512 * 2**20  # compiled grammars kept (by text) for requests that repeat a constraint
_XGRAMMAR_PREFIX = re.compile(r"^\[\d\d:\d\d:\d\d\] \S+:\d+: ")  # "[20:38:37] /project/cpp/x.cc:94: "
_CHECK_FAILED = re.compile(r"^Check failed: \(.*?\) is false: ")
# xgrammar 0.2.9 writes a length-bounded JSON string's characters (maxLength, minLength) as this class, which lets raw
# control characters through: JSON forbids them, and json.loads / pydantic refuse the output. Its unbounded strings
# use the right class; bounded ones get it too (a no-op once xgrammar fixes it).
_LOOSE_JSON_CHAR = r"[^\"\\\r\n]"
_JSON_CHAR = r"[^\"\\\0-\x1f]"


class Grammars:
    """Compiles constraints for one engine's vocabulary (on worker threads) and masks constrained rows (engine thread)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size  # the model's logits width (may exceed the tokenizer's length: padding)
        self.stop_ids = sorted(stop_ids)
        self._lock = threading.Lock()
        self._compiler: xgrammar.GrammarCompiler | None = None
        self._bitmask: torch.Tensor | None = None  # engine thread: [rows, ceil(vocab / 32)] int32 on the CPU
        self._batch: xgrammar.BatchGrammarMatcher | None = None  # engine thread

    def _get_compiler(self) -> xgrammar.GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                import xgrammar

                info = xgrammar.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_ids
                )
                # special tokens other than the stops (<|im_start|>, ...) never belong to constrained text: the
                # client's decode drops them (skip_special_tokens), a chat template would read them as structure
                vocab = list(info.decoded_vocab)
                for i in _special_ids(self._tokenizer) - set(self.stop_ids):
                    if i < len(vocab):
                        vocab[i] = b""  # xgrammar never allows a token that decodes to nothing
                info = xgrammar.TokenizerInfo(
                    vocab, xgrammar.VocabType.RAW, vocab_size=self.vocab_size, stop_token_ids=self.stop_ids
                )
                self._compiler = xgrammar.GrammarCompiler(
                    info, cache_enabled=True, cache_limit_bytes=_CACHE_BYTES
                )
            return self._compiler

    def matcher(self, kind: str, text: str) -> xgrammar.GrammarMatcher:
        """A fresh matcher for the constraint (blocking: call it on a worker thread); EngineRequestError if invalid."""
        compiler = self._get_compiler()
        import xgrammar

        try:
            if kind == "json_schema":  # xgrammar's defaults, as SGLang's: any whitespace, no extra keys
                grammar = str(xgrammar.Grammar.from_json_schema(text))
                compiled = compiler.compile_grammar(grammar.replace(_LOOSE_JSON_CHAR, _JSON_CHAR))
            elif kind == "regex":
                compiled = compiler.compile_regex(text)
            elif kind == "ebnf":  # the router's tool-call grammars embed xgrammar's JSON-schema rules
                compiled = compiler.compile_grammar(text.replace(_LOOSE_JSON_CHAR, _JSON_CHAR))
            else:
                raise EngineRequestError(f"unknown constraint kind {kind!r}; use one of {', '.join(KINDS)}")
        except (RuntimeError, ValueError, xgrammar.InvalidJSONError) as exc:
            raise EngineRequestError(f"sampling_params.{kind} is invalid: {_reason(exc)}") from None
        return xgrammar.GrammarMatcher(compiled)

    # ---- engine thread ------------------------------------------------------------------------------------------
    def mask(self, logits: torch.Tensor, rows: list[int], matchers: list[xgrammar.GrammarMatcher]) -> None:
        """Set to -inf, in place, every logit a row's grammar does not allow next (``logits[rows[i]]`` <- matcher i)."""
        import xgrammar

        n = logits.shape[0]
        if self._bitmask is None or self._bitmask.shape[0] < n:
            self._bitmask = xgrammar.allocate_token_bitmask(max(n, 8), self.vocab_size)
        bitmask = self._bitmask
        if len(matchers) == 1:
            matchers[0].fill_next_token_bitmask(bitmask, rows[0])
        else:
            if self._batch is None:
                self._batch = xgrammar.BatchGrammarMatcher()
            self._batch.batch_fill_next_token_bitmask(matchers, bitmask, rows)
        if logits.device.type != "cpu":
            bitmask = bitmask[:n].to(logits.device, non_blocking=True)
        xgrammar.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size, indices=rows)

    @staticmethod
    def accept(matchers: list[xgrammar.GrammarMatcher], tokens: list[int]) -> list[bool]:
        """Advance each matcher by its sampled token; False where the grammar refused it."""
        if len(matchers) == 1:
            return [matchers[0].accept_token(tokens[0])]
        import xgrammar

        return list(xgrammar.BatchGrammarMatcher.batch_accept_token(matchers, tokens))


def _special_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's special tokens (added tokens marked special, and the named ones)."""
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return {i for i, tok in added.items() if getattr(tok, "special", False)} | set(tokenizer.all_special_ids)


def _reason(exc: BaseException) -> str:
    """xgrammar's message without its log prefix (time, source file and line)."""
    text = str(exc).strip()
    text = _XGRAMMAR_PREFIX.sub("", text)
    return _CHECK_FAILED.sub("", text) or type(exc).__name__

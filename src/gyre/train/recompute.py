"""Activation checkpointing (``trainer.activation_checkpointing``): each decoder layer of a Hugging Face model keeps
only its inputs in forward and is computed again in backward, so a micro-step holds one layer's activations at a
time plus ``layers x tokens x hidden`` values, not every layer's (the lm head is chunked and checkpointed already,
`gyre.train.loss.chunked_logprobs`).

The recompute runs during ``backward()``, after the forward has left the scope that chose how attention is computed:
a tree's chain segments (`gyre.train.loss`) and a context-parallel layout (`gyre.train.context`) live in context
variables, and the attention function in the model's config, all set around the forward only. So each layer's
forward captures its context (``contextvars.copy_context``) and the model's attention implementation, and its
recompute runs under both: whatever a layer reads from its context is the same in recompute without this module
knowing what that is. Hugging Face's own per-layer checkpointing (``activation_checkpointing_enable``) does the
wrapping; torch's non-reentrant checkpoint's ``context_fn`` carries the capture. A context-parallel layer calls its
collectives again in recompute, in the same order on every rank (backward walks the same graph on each).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from typing import Any

_MISSING = object()


def enable(model: Any) -> None:
    """Checkpoint every decoder layer of the Hugging Face causal LM ``model`` (training mode, with gradients), its
    recompute under the context and attention implementation its forward ran with."""
    kwargs = {"use_reentrant": False, "context_fn": functools.partial(_contexts, model)}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def enabled(model: Any) -> bool:
    """Whether ``model``'s decoder layers are checkpointed."""
    return any(getattr(module, "gradient_checkpointing", False) for module in model.modules())


_Contexts = tuple[contextlib.AbstractContextManager[None], contextlib.AbstractContextManager[None]]


def _contexts(model: Any) -> _Contexts:
    """(at a layer's forward) torch's ``context_fn``: nothing around the forward, its state around the recompute."""
    state = _as_in(contextvars.copy_context(), model.config._attn_implementation, model)
    return contextlib.nullcontext(), state


@contextlib.contextmanager
def _as_in(saved: contextvars.Context, attention: str, model: Any) -> Iterator[None]:
    """Every context variable as in ``saved`` and ``model`` attending with ``attention``; both put back after."""
    tokens = [(var, var.set(value)) for var, value in saved.items() if var.get(_MISSING) is not value]
    previous = model.config._attn_implementation
    if previous != attention:
        model.set_attn_implementation(attention)
    try:
        yield
    finally:
        if previous != attention:
            model.set_attn_implementation(previous)
        for var, token in reversed(tokens):
            var.reset(token)

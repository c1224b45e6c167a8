"""Token-exact records of model calls (DESIGN section 5)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

import msgspec

Role = Literal["main", "main-summary", "sub-agent", "sub-agent-summary"]
ROLE_PRIORITY: tuple[Role, ...] = ("main", "main-summary", "sub-agent", "sub-agent-summary")
FinishReason = Literal["stop", "length", "abort", "error"]
# Who produced a call's output: ``policy`` (the model being trained sampled it: training data), ``scripted`` (a
# scripted expert at the engine edge: demonstrations, whose logprobs are made up), ``upstream`` (an outside model
# behind ``gyre eval --base-url``: evaluation only).
RecordSource = Literal["policy", "scripted", "upstream"]


class CallTiming(msgspec.Struct, frozen=True):
    """Wall-clock timestamps of one call, seconds since the epoch."""

    submitted_s: float  # the router received the request
    first_token_s: float | None  # first output token arrived (None when nothing was generated)
    finished_s: float  # the response was complete


class Divergence(msgspec.Struct, frozen=True, kw_only=True):
    """Where a chained call's input differs from the chat template's own render of its conversation.

    The router continues from the exact ids the model was served and produced; a template that writes the earlier
    reply otherwise (Qwen3 drops the reasoning of turns before the last user message, gpt-oss writes ``<|end|>``
    for the ``<|return|>`` sampled) gives a different canonical render. ``kind``: ``reasoning``, ``terminator``,
    ``tokenization`` (the same text in other ids), ``render`` (anything else), or ``unchained`` (the template
    showed no turn boundary, so the call is a new branch)."""

    kind: Literal["reasoning", "terminator", "tokenization", "render", "unchained"]
    index: int  # the first differing position in the call's whole input (0 for unchained)


class CallRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the model saw and produced in one call, token for token, stored as a delta on the call it extends.

    A call whose input starts with an earlier call's input + output (the next turn of a conversation) stores only
    the tokens after that prefix, so a session's records grow with the tokens it adds, not with the square of its
    length: ``input = expand_inputs(...)[parent] + parent.output_ids + new_input_ids``. A new branch (first call,
    compaction, sub-agent, edited history) has no parent and stores its whole input.

    Invariant: ``output_ids`` are exactly the tokens the engine sampled and ``output_logprobs[i]`` is the
    behaviour log-probability of ``output_ids[i]`` under weight version ``token_versions()[i]``. A call moved
    between engines mid-generation (a drain, a failure) may have tokens sampled under different versions; then
    ``output_versions`` holds one version per output token, else it is None and every token has ``weight_version``.
    """

    call_id: str  # unique per run
    session: str  # the execution's router session
    role: Role
    parent_call_id: str | None = None  # the earlier call this one extends token-exactly; None: a new branch
    prefix_len: int = 0  # leading input tokens that are the parent's input + output (0 without a parent)
    new_input_ids: list[int]  # the input after that prefix
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: FinishReason
    weight_version: int  # optimizer step that sampled the first output token (or answered, with no output)
    cell: str  # engine/cell that produced the output (the last one when a call was moved)
    timing: CallTiming
    output_versions: list[int] | None = None  # a weight version per output token; None: all weight_version
    source: RecordSource = "policy"  # who produced the output; only "policy" output is the behaviour policy's
    divergence: Divergence | None = (
        None  # where the input differs from the template's canonical render; None: not
    )

    def __post_init__(self) -> None:
        if len(self.output_ids) != len(self.output_logprobs):
            raise ValueError(
                f"CallRecord {self.call_id}: {len(self.output_ids)} output ids but "
                f"{len(self.output_logprobs)} logprobs"
            )
        if not all(math.isfinite(lp) for lp in self.output_logprobs):  # JSON cannot carry them back
            raise ValueError(f"CallRecord {self.call_id}: a behaviour logprob is NaN or infinite")
        if (self.parent_call_id is None) != (self.prefix_len == 0):
            raise ValueError(f"CallRecord {self.call_id}: a parent needs a prefix length and vice versa")
        if self.output_versions is not None:
            if len(self.output_versions) != len(self.output_ids):
                raise ValueError(
                    f"CallRecord {self.call_id}: {len(self.output_ids)} output ids but "
                    f"{len(self.output_versions)} weight versions"
                )
            if self.output_versions and self.output_versions[0] != self.weight_version:
                raise ValueError(
                    f"CallRecord {self.call_id}: weight_version {self.weight_version} is not the first output "
                    f"token's ({self.output_versions[0]})"
                )

    def token_versions(self) -> list[int]:
        """The weight version that sampled each output token."""
        if self.output_versions is not None:
            return list(self.output_versions)
        return [self.weight_version] * len(self.output_ids)


class ApiCallRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A call to an outside OpenAI-compatible model (``gyre eval --base-url``): text, not tokens.

    Such a model's tokens and behaviour logprobs are not visible, so these calls are for evaluation only and never
    become training data; the request and the response are kept as sent and received.
    """

    call_id: str
    session: str
    role: Role
    endpoint: Literal["chat/completions", "completions"]
    request: dict[str, Any]  # the body sent upstream
    response: dict[str, Any]  # the body that came back
    prompt_tokens: int  # as the upstream's usage reports them (0 when it reports none)
    completion_tokens: int
    timing: CallTiming
    source: Literal["upstream"] = "upstream"


def expand_inputs(records: Iterable[CallRecord]) -> dict[str, list[int]]:
    """The full input ids of each record, given records in call order (parents before children)."""
    by_id: dict[str, CallRecord] = {}
    full: dict[str, list[int]] = {}
    for record in records:
        prefix: list[int] = []
        if record.parent_call_id is not None:
            parent = by_id.get(record.parent_call_id)
            if parent is None:
                raise ValueError(
                    f"record {record.call_id} extends {record.parent_call_id}, which comes later or not at all"
                )
            prefix = full[parent.call_id] + parent.output_ids
            if len(prefix) != record.prefix_len:
                raise ValueError(
                    f"record {record.call_id}: its parent gives {len(prefix)} prefix tokens, it says {record.prefix_len}"
                )
        full[record.call_id] = prefix + record.new_input_ids
        by_id[record.call_id] = record
    return full


def input_tails(records: Iterable[CallRecord], keep: int) -> dict[str, tuple[int, list[int]]]:
    """``(input length, last keep input ids)`` of each record, given records in call order (parents before children).

    What `expand_inputs` gives, cut to its last ``keep`` ids: time and memory grow with calls x ``keep``, not with
    the square of a session's tokens, so a window over a 700K-token execution never materialises whole inputs.
    """
    if keep < 0:
        raise ValueError(f"keep must not be negative, not {keep}")
    by_id: dict[str, CallRecord] = {}
    tails: dict[str, tuple[int, list[int]]] = {}
    for record in records:
        length, tail = 0, []
        if record.parent_call_id is not None:
            parent = by_id.get(record.parent_call_id)
            if parent is None:
                raise ValueError(
                    f"record {record.call_id} extends {record.parent_call_id}, which comes later or not at all"
                )
            parent_length, parent_tail = tails[parent.call_id]
            length = parent_length + len(parent.output_ids)
            if length != record.prefix_len:
                raise ValueError(
                    f"record {record.call_id}: its parent gives {length} prefix tokens, it says {record.prefix_len}"
                )
            tail = [*parent_tail[-keep:], *parent.output_ids[-keep:]] if keep else []
        length += len(record.new_input_ids)
        tails[record.call_id] = (length, [*tail, *record.new_input_ids][-keep:] if keep else [])
        by_id[record.call_id] = record
    return tails


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(CallRecord)


def encode_record(record: CallRecord) -> bytes:
    """One JSON line (without the newline) for the journal."""
    return _encoder.encode(record)


def decode_record(line: bytes | str) -> CallRecord:
    """Parse one journal line back into a CallRecord."""
    return _decoder.decode(line)

"""Token-exact records of model calls (DESIGN section 5)."""

from __future__ import annotations

import math
from typing import Literal

import msgspec

Role = Literal["main", "main-summary", "sub-agent", "sub-agent-summary"]
ROLE_PRIORITY: tuple[Role, ...] = ("main", "main-summary", "sub-agent", "sub-agent-summary")
FinishReason = Literal["stop", "length", "abort", "error"]


class CallTiming(msgspec.Struct, frozen=True):
    """Wall-clock timestamps of one call, seconds since the epoch."""

    submitted_s: float  # the router received the request
    first_token_s: float | None  # first output token arrived (None when nothing was generated)
    finished_s: float  # the response was complete


class CallRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the model saw and produced in one call, token for token.

    Invariant: ``output_ids`` are exactly the tokens the engine sampled and ``output_logprobs[i]`` is the
    behaviour log-probability of ``output_ids[i]`` under weight version ``weight_version``.
    """

    call_id: str  # unique per run
    session: str  # the execution's router session
    role: Role
    input_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: FinishReason
    weight_version: int  # optimizer step that produced the weights; a rerouted call keeps the first
    cell: str  # engine/cell that produced the output (the last one when a call was moved)
    timing: CallTiming
    parent_call_id: str | None = (
        None  # the earlier call this one extends token-exactly, None for a new branch
    )

    def __post_init__(self) -> None:
        if len(self.output_ids) != len(self.output_logprobs):
            raise ValueError(
                f"CallRecord {self.call_id}: {len(self.output_ids)} output ids but "
                f"{len(self.output_logprobs)} logprobs"
            )
        if not all(math.isfinite(lp) for lp in self.output_logprobs):  # JSON cannot carry them back
            raise ValueError(f"CallRecord {self.call_id}: a behaviour logprob is NaN or infinite")

    @property
    def token_ids(self) -> list[int]:
        """The full sequence: input followed by output."""
        return self.input_ids + self.output_ids


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(CallRecord)


def encode_record(record: CallRecord) -> bytes:
    """One JSON line (without the newline) for the journal."""
    return _encoder.encode(record)


def decode_record(line: bytes | str) -> CallRecord:
    """Parse one journal line back into a CallRecord."""
    return _decoder.decode(line)

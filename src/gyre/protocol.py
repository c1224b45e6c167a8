"""Every message that crosses a process boundary, as msgspec Structs.

Channels:
- engine HTTP API (client <-> inference engine): SGLang's native JSON bodies, so one client serves the embedded
  engine and a real SGLang server. Fields and defaults follow SGLang's ``io_struct.py``; the embedded engine rejects
  sampling parameters it does not know, and ignores top-level fields it does not use (as SGLang clients send many).
- control plane (controller <-> cells, ZeroMQ, msgpack): added with the elastic scheduler.

New fields go at the end with defaults.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import msgspec

from gyre.errors import ProtocolError

NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
T = TypeVar("T")


class SamplingParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How to sample one request (SGLang's ``sampling_params``)."""

    max_new_tokens: NonNegInt | None = 128  # None: until the context is full
    temperature: Annotated[float, msgspec.Meta(ge=0.0)] = 1.0  # 0: greedy
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, msgspec.Meta(ge=-1)] = -1  # -1 or 0: no limit
    min_p: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.0
    min_new_tokens: NonNegInt = 0  # end-of-sequence and stop tokens are ignored before this many tokens
    stop: str | list[str] | None = None  # stop strings, matched on the decoded output
    stop_token_ids: list[int] | None = None  # extra end-of-sequence token ids
    ignore_eos: bool = False
    skip_special_tokens: bool = True  # for the returned text only; output_ids are always complete
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False  # keep the matched stop string in the returned text
    sampling_seed: Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | None = (
        None  # same seed -> same tokens
    )
    n: Annotated[int, msgspec.Meta(ge=1, le=1)] = 1
    frequency_penalty: Annotated[float, msgspec.Meta(ge=0.0, le=0.0)] = (
        0.0  # accepted for compatibility; only 0
    )
    presence_penalty: Annotated[float, msgspec.Meta(ge=0.0, le=0.0)] = 0.0
    repetition_penalty: Annotated[float, msgspec.Meta(ge=1.0, le=1.0)] = 1.0

    @property
    def stop_strings(self) -> list[str]:
        """``stop`` as a list (empty when unset)."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class GenerateRequest(msgspec.Struct, kw_only=True):
    """``POST /generate``: exactly one of ``text`` and ``input_ids``."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: SamplingParams = msgspec.field(default_factory=SamplingParams)
    rid: str | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: NonNegInt = 0
    stream: bool = False
    return_text_in_logprobs: bool = False


class GenerateMeta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``meta_info`` of a ``/generate`` response."""

    id: str
    finish_reason: dict[str, Any] | None  # {"type": "stop"|"length"|"abort", ...}; None while streaming
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    weight_version: str = "default"
    e2e_latency: float = 0.0
    # [[logprob, token_id, None], ...] when return_logprob was set
    output_token_logprobs: list[tuple[float, int, str | None]] | None = None
    input_token_logprobs: list[tuple[float | None, int, str | None]] | None = None
    output_top_logprobs: list[list[tuple[float, int, str | None]] | None] | None = None


class GenerateResponse(msgspec.Struct, kw_only=True):
    """A ``/generate`` response (and each streamed chunk: cumulative, as SGLang streams by default)."""

    text: str
    output_ids: list[int]
    meta_info: GenerateMeta

    @property
    def finish_type(self) -> str | None:
        """``stop``, ``length``, ``abort`` or None while unfinished."""
        fr = self.meta_info.finish_reason
        return None if fr is None else str(fr.get("type"))

    @property
    def output_logprobs(self) -> list[float]:
        """Behaviour log-probability of each output token (empty unless ``return_logprob``)."""
        return [float(lp) for lp, _, _ in self.meta_info.output_token_logprobs or []]


class AbortRequest(msgspec.Struct, kw_only=True):
    """``POST /abort_request``."""

    rid: str = ""
    abort_all: bool = False


class PauseGenerationRequest(msgspec.Struct, kw_only=True):
    """``POST /pause_generation``: ``abort`` ends in-flight requests, ``in_place`` freezes them, ``retract``
    frees their KV and requeues them."""

    mode: Literal["abort", "retract", "in_place"] = "abort"


class MemoryRequest(msgspec.Struct, kw_only=True):
    """``POST /release_memory_occupation`` and ``/resume_memory_occupation``; None means every tag."""

    tags: list[Literal["weights", "kv_cache", "cuda_graph"]] | None = None


class UpdateWeightsFromDiskRequest(msgspec.Struct, kw_only=True):
    """``POST /update_weights_from_disk``."""

    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


class InitWeightsUpdateGroupRequest(msgspec.Struct, kw_only=True):
    """``POST /init_weights_update_group``: the trainer is rank 0, engine ranks start at ``rank_offset``."""

    master_address: str
    master_port: Annotated[int, msgspec.Meta(gt=0, le=65535)]
    rank_offset: NonNegInt
    world_size: Annotated[int, msgspec.Meta(ge=2)]
    group_name: str = "weight_update_group"
    backend: str = "gloo"


class UpdateWeightsFromDistributedRequest(msgspec.Struct, kw_only=True):
    """``POST /update_weights_from_distributed``: rank 0 broadcasts each named tensor, in order."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None


class ResultResponse(msgspec.Struct, kw_only=True):
    """``{"success": ..., "message": ...}`` of SGLang's admin endpoints."""

    success: bool
    message: str = ""


class ExportKVRequest(msgspec.Struct, kw_only=True):
    """Gyre extension ``POST /gyre/export_kv``: the KV of the longest cached prefix of ``input_ids``."""

    input_ids: list[int]


class ErrorBody(msgspec.Struct, kw_only=True):
    """The JSON body of every 4xx/5xx the embedded engine answers."""

    error: dict[str, Any]  # {"message": str, "type": str, "code": int}


def decode_json(data: bytes, type_: type[T], what: str) -> T:
    """Decode a JSON body into ``type_``; a ProtocolError says which field was wrong."""
    try:
        return msgspec.json.decode(data, type=type_)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"invalid {what}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"{what} is not valid JSON: {exc}") from None

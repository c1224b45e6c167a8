"""Every message that crosses a process boundary, as msgspec Structs.

Channels:
- engine HTTP API (client <-> inference engine): SGLang's native JSON bodies, so one client serves the embedded
  engine and a real SGLang server. Fields and defaults follow SGLang's ``io_struct.py``; the embedded engine rejects
  sampling parameters it does not know, and ignores top-level fields it does not use (as SGLang clients send many).
- trainer (satellites and the driver <-> the core trainer, ZeroMQ, msgpack): `TrainerRequest` / `TrainerReply`.
- control plane (cells <-> the controller, ZeroMQ, msgpack): `CellMessage` / `ControllerMessage`.

New fields go at the end with defaults.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from gyre.errors import ProtocolError

NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
T = TypeVar("T")
MAX_WEIGHT_VERSION = 2**63 - 1  # versions are int64 wherever they are stored


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
    # Constrained decoding (SGLang's names; at most one): the output must match a JSON schema (a JSON string), a
    # regular expression, or an EBNF grammar in xgrammar's dialect. The embedded engine masks each step's logits with
    # xgrammar; SGLang does the same with its grammar backend.
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None

    @property
    def grammar(self) -> tuple[str, str] | None:
        """The constraint as ``(kind, text)``, kind one of ``json_schema``, ``regex``, ``ebnf``; None when unset."""
        given = [(k, v) for k, v in (("json_schema", self.json_schema), ("regex", self.regex), ("ebnf", self.ebnf))
                 if v is not None]  # fmt: skip
        if len(given) > 1:
            raise ValueError(
                f"at most one of json_schema, regex and ebnf; got {', '.join(k for k, _ in given)}"
            )
        return given[0] if given else None

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
    weight_version: str = "default"  # Gyre needs a decimal integer (`parse_weight_version`)
    e2e_latency: float = 0.0
    # [[logprob, token_id, None], ...] when return_logprob was set
    output_token_logprobs: list[tuple[float, int, str | None]] | None = None
    input_token_logprobs: list[tuple[float | None, int, str | None]] | None = None
    output_top_logprobs: list[list[tuple[float, int, str | None]] | None] | None = None
    # Gyre extension (a real SGLang server never sends it): "scripted" when a script wrote the tokens rather
    # than a policy sampling them (`gyre.engine.scripted`); their logprobs are made up.
    gyre_source: str = "policy"


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
    """``POST /update_weights_from_distributed``: rank 0 broadcasts each named tensor, in order; with
    ``load_format="flattened_bucket"`` (SGLang's) it broadcasts them as one uint8 buffer, their bytes concatenated.
    A push in buckets is several calls; ``buckets_left`` (Gyre's) counts the calls after this one, and the version
    changes only with the last."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: Literal["flattened_bucket"] | None = None
    buckets_left: NonNegInt = 0  # calls of this push still to come; the engine holds requests until the last


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


def parse_weight_version(value: str, where: str) -> int:
    """A weight version as SGLang's API carries it (a string) -> the optimizer step it names.

    Gyre numbers weights by optimizer step, so anything but a non-negative decimal integer (SGLang's
    ``"default"`` when a server was started without ``--weight-version``, ``"v2"``, ``"-1"``, ``" 3"``) is a
    ProtocolError that names ``where`` the value came from.
    """
    ok = isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19
    if not (ok and int(value) <= MAX_WEIGHT_VERSION):
        shown = repr(value[:40]) + "..." if isinstance(value, str) and len(value) > 40 else repr(value)
        raise ProtocolError(
            f"{where}: weight version {shown} is not a non-negative integer; Gyre numbers weights by "
            "optimizer step (start SGLang servers with --weight-version 0, update weights with integer versions)"
        )
    return int(value)


def format_weight_version(version: int) -> str:
    """The wire form (a decimal string) of a weight version; refuses what `parse_weight_version` refuses."""
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_WEIGHT_VERSION:
        raise ProtocolError(f"weight version {version!r} is not a non-negative integer")
    return str(version)


# ---- trainer channel: satellites and the driver <-> the core trainer (ZeroMQ DEALER -> ROUTER, msgpack) ----------
# Tensors never travel here: weights and gradients go over each member's torch.distributed pair group with the
# core (gyre.train.coretrainer). Every pair-group transfer is announced by a message on this channel first, from the side
# that starts it, so both ends issue their collectives in the same order.

Objective = Literal["policy", "supervised"]


class MicroStep(msgspec.Struct, frozen=True, kw_only=True):
    """One packed row of sequences a trainer computes gradients for; index ``i`` is a token.

    Token ``i`` is predicted from the logits at ``parents[i]`` (-1: a sequence's first token, never predicted);
    attention runs from each token to its ancestors along ``parents`` only. ``objective`` says which loss the
    weighted tokens feed: ``policy`` (clipped policy gradient: only tokens the policy sampled) or ``supervised``
    (negative log-likelihood of demonstrations).
    """

    input_ids: list[int]
    position_ids: list[int]
    parents: list[int]
    weights: list[float]  # loss weight of predicting token i (0: context, or trained in another sequence)
    advantages: list[float]
    behaviour_logprobs: list[float]
    versions: list[int]  # weight version that sampled token i (-1: context)
    sequences: int  # sequences packed in this row
    objective: Objective = "policy"


class MicroStats(msgspec.Struct, frozen=True, kw_only=True):
    """Sums over the loss-weighted tokens of one micro-step; a step's figures are sums over its micro-steps."""

    loss: float = 0.0  # weighted loss (the step's weights sum to 1, so these add up to the step's loss)
    tokens: int = 0  # tokens with loss weight
    policy_tokens: int = 0  # of which feed the policy-gradient loss (the ratio figures are over these)
    computed_tokens: int = 0  # tokens through the forward pass
    clipped: int = 0  # tokens whose ratio was clipped (their gradient is zero)
    truncated: int = 0  # tokens whose importance weight was cut at ``tis_cap``
    ratio_sum: float = 0.0  # of exp(logprob - behaviour logprob)
    ratio_sq_sum: float = 0.0
    ratio_min: float = math.inf
    ratio_max: float = 0.0
    entropy_sum: float = 0.0  # nats
    kl_sum: float = 0.0  # k3 estimate against the reference, nats
    staleness_sum: int = 0  # policy version minus behaviour version, summed over sampled tokens
    staleness_max: int = 0
    seconds: float = 0.0  # forward + backward


class StepMetrics(msgspec.Struct, frozen=True, kw_only=True):
    """What one optimizer step did (one line of metrics)."""

    step: int  # the step that finished (0-based)
    version: int  # the weight version after it
    loss: float
    tokens: int  # trained tokens
    computed_tokens: int
    micro_steps: int
    clip_fraction: float
    truncated_fraction: float
    ratio_mean: float
    ratio_std: float
    ratio_min: float
    ratio_max: float
    entropy: float  # mean per trained token, nats
    kl: float  # mean per trained token, nats (0 without a reference)
    grad_norm: float  # before clipping
    lr: float
    staleness_mean: float  # versions
    staleness_max: int
    seconds: float  # from the step's first micro-step to its update
    by_member: dict[str, int]  # micro-steps each member computed (accepted gradients)
    discarded: int  # gradients received for micro-steps already done (a member declared gone came back)
    reclaimed: int  # claims returned to the queue (members that left or were declared gone mid-micro-step)
    # why the step trained nothing (its every execution dropped, say): no update, weights and optimizer unchanged,
    # the version still moves on; empty when it trained
    untrained: str = ""
    repeated_submits: int = 0  # submits of this step the core acknowledged without taking (seen before)
    gradient_bytes_in: int = 0  # gradient bytes members sent the core for this step (the core's own: none)


class Hello(msgspec.Struct, tag="hello", kw_only=True):
    """A satellite joins (or rejoins) training; the core answers ``Welcome``."""

    member: str
    hostname: str = ""
    pid: int = 0
    group_name: str = ""  # the pair group it still holds from an earlier join (reused if the core agrees)


class Claim(msgspec.Struct, tag="claim", kw_only=True):
    """A member asks for work, holding weights of ``version`` (-1: none yet)."""

    member: str
    version: int


class GradientReady(msgspec.Struct, tag="gradient", kw_only=True):
    """A member finished micro-step ``index`` of ``step``; its flat fp32 gradient follows over the pair group."""

    member: str
    step: int
    index: int
    numel: int
    stats: MicroStats


class Goodbye(msgspec.Struct, tag="goodbye", kw_only=True):
    """A member leaves the step (after the micro-step it held); its pair group stays for a later rejoin."""

    member: str


class Heartbeat(msgspec.Struct, tag="heartbeat", kw_only=True):
    """A member is alive (sent from its own thread, also while it computes)."""

    member: str


class Computed(msgspec.Struct, tag="computed", kw_only=True):
    """A member computed micro-step ``index`` of ``step``; its gradient waits in the member's local sum (held)
    until ``GradientSum`` sends it."""

    member: str
    step: int
    index: int
    stats: MicroStats


class GradientSum(msgspec.Struct, tag="gradient_sum", kw_only=True):
    """A member's local sum of the gradients of micro-steps ``indices`` of ``step`` follows over the pair group:
    ``numel`` values of ``dtype`` (float64), counted once the whole sum has arrived."""

    member: str
    step: int
    indices: list[int]
    numel: int
    dtype: str = "float64"


class SubmitMicroSteps(msgspec.Struct, tag="submit", kw_only=True):
    """Driver: micro-steps of ``step`` (streamed: several submits per step); ``seal`` when none will follow."""

    step: int
    micro_steps: list[MicroStep]
    seal: bool = False
    data_cursor: dict[str, Any] | None = None  # kept in the checkpoint of this step (set with ``seal``)
    # with ``seal``: why the step may hold no micro-steps (kept in its metrics if it holds none)
    untrained: str = ""
    # the driver's id for this submit: the core takes each once, a repeat (a retry, a duplicate) is only acknowledged
    submission: str = ""


class WaitStep(msgspec.Struct, tag="wait_step", kw_only=True):
    """Driver: answer ``StepDone`` once ``step`` has been applied (at once if it already was)."""

    step: int


class ReleaseMember(msgspec.Struct, tag="release", kw_only=True):
    """Driver/controller: tell ``member`` to leave after the micro-step it holds."""

    member: str


class AttachEngine(msgspec.Struct, tag="attach_engine", kw_only=True):
    """Driver: push weights to the engine at ``url`` after every update (and now, to bring it up to date)."""

    url: str


class SaveCheckpoint(msgspec.Struct, tag="save_checkpoint", kw_only=True):
    """Driver: write a checkpoint of the current weights and optimizer state to ``path`` (between steps)."""

    path: str


class SetEngine(msgspec.Struct, tag="set_engine", kw_only=True):
    """A cell: push weights to the engine at ``url`` after updates (``active``; attached and brought up to date
    before the ``Ack``), or stop (answered once a push under way has ended, so its memory can be released)."""

    url: str
    active: bool


class GetStatistics(msgspec.Struct, tag="get_statistics", kw_only=True):
    """Anyone: answer ``TrainerStatistics``."""


class Shutdown(msgspec.Struct, tag="shutdown", kw_only=True):
    """Driver: stop the core (members are told to leave)."""


TrainerRequest = (
    Hello | Claim | GradientReady | Goodbye | Heartbeat | SubmitMicroSteps | WaitStep | ReleaseMember
    | AttachEngine | SaveCheckpoint | GetStatistics | Shutdown | SetEngine | Computed | GradientSum
)  # fmt: skip


class PairAddress(msgspec.Struct, frozen=True, kw_only=True):
    """One of a member's pair groups with the core cell: core rank ``rank`` (rank 0 of the pair) hosts it; the flat
    range ``[start, end)`` of weights and gradient sums is what travels over it."""

    rank: int
    host: str
    port: int
    name: str
    start: int
    end: int


class Welcome(msgspec.Struct, tag="welcome", kw_only=True):
    """The core accepted a member; both now join the pair group at ``group_host:group_port`` (core rank 0)."""

    member: str
    group_host: str
    group_port: int
    group_name: str
    model_config: dict[str, Any]  # the Hugging Face config.json of the trained model
    reference: bool  # the reference weights for the KL term follow first over the pair group
    loss: dict[str, Any]  # the core's [trainer.loss], so every member computes the same objective
    heartbeat_s: float
    member_timeout_s: float
    transfer_timeout_s: float
    backend: str = "gloo"  # the pair group's collective (trainer.collective), not the training backend
    numel: int = 0  # values in the flat weight buffer (Hugging Face layout, whatever computes)
    modelled_tokens_per_s: float = 0.0  # the core's [trainer] pacing, so every member models the same device
    # one pair group per rank of the core cell, each carrying that rank's range (empty: the one group above, whole)
    pairs: list[PairAddress] = []
    bucket_mib: float = 512.0  # transfers over a pair group go in pieces of this size (trainer.bucket_mib)
    activation_checkpointing: bool = False  # members recompute decoder layers in backward (core [trainer])


class Assign(msgspec.Struct, tag="assign", kw_only=True):
    """Compute micro-step ``index`` of ``step`` at weight ``version``."""

    step: int
    version: int
    index: int
    micro: MicroStep


class Refresh(msgspec.Struct, tag="refresh", kw_only=True):
    """The step's weights (``version``) follow now over the pair group; then claim again."""

    step: int
    version: int


class Idle(msgspec.Struct, tag="idle", kw_only=True):
    """Nothing to claim now; wait for ``Wake``."""


class Wake(msgspec.Struct, tag="wake", kw_only=True):
    """There may be work: claim again."""


class Leave(msgspec.Struct, tag="leave", kw_only=True):
    """Leave training (answered to a claim after the member was released): send the sum you hold first."""

    final: bool = False  # the core shuts down: it receives nothing more (the step under way is not applied)


class Flush(msgspec.Struct, tag="flush", kw_only=True):
    """Nothing more to claim in ``step``: send the sum of the micro-steps you hold (``GradientSum``), then claim."""

    step: int


class Ping(msgspec.Struct, tag="ping", kw_only=True):
    """The core is alive."""


class StepDone(msgspec.Struct, tag="step_done", kw_only=True):
    """A step was applied."""

    metrics: StepMetrics


class Ack(msgspec.Struct, tag="ack", kw_only=True):
    """A driver request was carried out."""

    detail: str = ""


class Refused(msgspec.Struct, tag="refused", kw_only=True):
    """A request could not be carried out; ``reason`` says why and what to do."""

    reason: str


class TrainerStatistics(msgspec.Struct, tag="statistics", kw_only=True, frozen=True):
    """The core's view of the current step and its members."""

    step: int  # the step being computed (or next to be)
    version: int  # weight version of that step
    members: dict[str, str]  # member -> active | parked | gone
    claims: dict[str, list[int]]  # member -> micro-step indices it holds now
    pending: int  # micro-steps nobody holds
    done: int  # micro-steps with their gradient summed
    sealed: bool
    engines: list[str]
    weight_bytes: int = 0  # size of one copy of the weights
    push_s: dict[str, float] = {}  # engine url -> seconds its fastest weight push took
    push_total_s: float = 0.0  # seconds of every push so far, summed over engines
    detached: dict[str, str] = {}  # engine url -> why the core stopped pushing to it (until it answers again)
    held: dict[str, list[int]] = {}  # member -> micro-steps it computed whose gradient it has not sent yet
    gradient_bytes_in: int = 0  # gradient bytes members sent the core, all steps (the core's own: none)
    # each rank of the core cell (trainer.ranks > 1): its range and bytes of state (gyre.train.sharded.ShardStatistics)
    ranks: list[dict[str, int]] = []
    context_micro_steps: int = 0  # micro-steps the cell's ranks computed together (max_tokens_per_rank)


TrainerReply = (
    Welcome | Assign | Refresh | Idle | Wake | Leave | Ping | StepDone | Ack | Refused | TrainerStatistics
    | Flush
)  # fmt: skip


# ---- control plane: cells (DEALER) <-> the controller (ROUTER) -------------------------------------------------------
CellRole = Literal["serving", "draining", "training", "resuming", "gone"]
CellKind = Literal["core", "satellite", "standalone"]  # what a cell is when it trains (standalone: never)


class CellHello(msgspec.Struct, tag="cell_hello", kw_only=True):
    """A cell started (or reconnected): it serves ``engine_url``; the core cell also says where its trainer is."""

    cell: str
    kind: CellKind
    order: int  # place in the training order (0: the core); standalone cells serve only
    engine_url: str
    capacity: int  # executions it hosts while serving
    core_address: str = ""  # the core cell's trainer (``tcp://HOST:PORT``)
    role: CellRole = "serving"  # what it is doing now (a reconnecting cell may be training)
    version: int = -1  # the weights its engine serves
    hostname: str = ""
    pid: int = 0
    seq: int = 0  # this cell process's message count: a Hello older than what the controller knows is stale


class CellBeat(msgspec.Struct, tag="cell_beat", kw_only=True):
    """A cell is alive (its own thread, also while it switches), and what it is doing now."""

    cell: str
    seq: int = 0  # as in CellHello
    role: CellRole | None = None  # where a lost report left the controller behind, beats bring it up to date
    version: int = -1


class SwitchDone(msgspec.Struct, tag="switch_done", kw_only=True):
    """A cell finished its part of switch ``switch``; ``phases`` in seconds, in order; ``error`` if it failed."""

    cell: str
    switch: int
    role: CellRole  # the role it is in now
    phases: dict[str, float]
    version: int = -1  # the weights its engine serves (after train -> serve)
    error: str = ""


CellMessage = CellHello | CellBeat | SwitchDone


class CellWelcome(msgspec.Struct, tag="cell_welcome", kw_only=True):
    """The controller knows the cell; satellites and standalone servers learn the core's trainer address here."""

    cell: str
    core_address: str
    heartbeat_s: float
    cell_timeout_s: float


class StartTraining(msgspec.Struct, tag="start_training", kw_only=True):
    """Serve -> train, after the router drained the cell: release engine memory, join the step."""

    switch: int


class StartServing(msgspec.Struct, tag="start_serving", kw_only=True):
    """Train -> serve: leave the step, resume engine memory, take the current weights, report the version."""

    switch: int


class ControlPing(msgspec.Struct, tag="control_ping", kw_only=True):
    """The controller is alive."""


class CellShutdown(msgspec.Struct, tag="cell_shutdown", kw_only=True):
    """Stop the cell (its engine and trainer with it)."""


class CellRefused(msgspec.Struct, tag="cell_refused", kw_only=True):
    """The controller will not plan with this cell; ``reason`` says why."""

    reason: str


ControllerMessage = CellWelcome | StartTraining | StartServing | ControlPing | CellShutdown | CellRefused


class SwitchRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One role switch as journaled in ``switches.jsonl``: phases in order, seconds each."""

    switch: int
    cell: str
    direction: Literal["serve_to_train", "train_to_serve"]
    started: float  # wall clock (time.time())
    phases: dict[str, float]
    total_s: float
    version: int = -1  # the engine's weights after train -> serve
    moved_calls: int = 0  # calls continued elsewhere by the drain
    error: str = ""


# ---- a tensor-parallel member's group: rank 0 -> its other ranks (over each rank's stdin) ---------------------------


class MegatronLoad(msgspec.Struct, tag="megatron_load", kw_only=True):
    """Take the weights rank 0 broadcasts next (Hugging Face layout, flat) into your part of the model."""

    reference: bool = False  # into the frozen reference model rather than the trained one


class MegatronCompute(msgspec.Struct, tag="megatron_compute", kw_only=True):
    """Forward and backward of one micro-step on your part of the model (gradients accumulate)."""

    micro: MicroStep
    loss: dict[str, Any]  # a LossConfig as builtins
    version: int


class MegatronGather(msgspec.Struct, tag="megatron_gather", kw_only=True):
    """Send your part's gradients to rank 0 (a gather over the group) and clear them."""


class MegatronStop(msgspec.Struct, tag="megatron_stop", kw_only=True):
    """Leave the group and exit."""


MegatronCommand = MegatronLoad | MegatronCompute | MegatronGather | MegatronStop

"""Configuration: msgspec Structs loaded from one TOML file, with dotted-key overrides.

Every field with a unit carries it in its name (``timeout_s``, ``kv_cache_mem_gib``); bounds are ``msgspec.Meta``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from gyre.errors import ConfigError
from gyre.journal.records import RecordSource

Positive = Annotated[int, msgspec.Meta(gt=0)]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class EngineConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The embedded inference engine."""

    model_path: str = ""  # Hugging Face model directory (config.json, safetensors, tokenizer)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when available, else cpu
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = (
        "auto"  # auto: float32 on cpu, bfloat16 on cuda
    )
    num_threads: NonNegative = (
        0  # torch threads on cpu; 0: 1 for models under 50 M parameters, else torch's default
    )
    kv_cache_mem_gib: Annotated[float, msgspec.Meta(gt=0)] = 1.0  # memory for the KV cache pool
    max_running_requests: Positive = 256  # requests decoded together in one batch
    max_prefill_tokens: Positive = 2048  # prompt tokens computed per engine step (chunked prefill)
    context_length: NonNegative = 0  # longest input+output; 0 uses the model's max_position_embeddings
    enable_prefix_cache: bool = True  # reuse the KV of earlier requests' tokens
    decode_lanes: bool = True  # decode attention over contiguous per-request KV (1/8 of kv_cache_mem_gib)
    seed: int = 0  # seed of the sampling generator
    weight_version: NonNegative = 0  # reported until the first weight update sets another
    modelled_step_s: Annotated[float, msgspec.Meta(ge=0.0)] = (
        0.0  # every engine step lasts at least this (a modelled accelerator, for benchmarks); 0: off
    )
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 30000


class RouterConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The OpenAI-compatible router in front of the inference engines."""

    engines: list[str] = msgspec.field(default_factory=list)  # engine base URLs (SGLang API)
    model_path: str = ""  # the served model's directory: chat template and tokenizer
    model_name: str = ""  # the name clients pass as `model`; empty: the model directory's name
    host: str = "127.0.0.1"  # agent-facing address; admin operations are never served here
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8000
    admin_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = (
        8001  # drain, engines, sessions (127.0.0.1 only)
    )
    journal_dir: str = ""  # where calls.jsonl is appended; empty: no journal file
    journal_fsync: bool = False  # fsync every record (survives power loss, not only a crash)
    wait_for_engine_s: Annotated[float, msgspec.Meta(ge=0)] = (
        60.0  # a call waits this long for a serving engine
    )
    retry_budget: NonNegative = 8  # engine failures one call survives before it fails with 503
    request_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 3600.0  # one engine request, end to end
    # liveness of engines with calls in flight: asked for /health every second, an answer must come within
    # probe_timeout_s; one silent for hung_after_s is hung and its calls continue elsewhere (generation time, a long
    # prefill say, plays no part)
    probe_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    hung_after_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    # larger request bodies get 413; 8 MiB of JSON holds more text than a 1M-token context
    max_body_mib: Annotated[float, msgspec.Meta(gt=0)] = 8.0
    body_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = (
        30.0  # a request head, then its body, must arrive within
    )
    # JSON values (numbers, strings, keys, arrays, objects) one request body may hold, counted before it is decoded
    # (decoded, a small value takes 30-200 bytes); a prompt of token ids as long as the context always fits
    max_json_values: Positive = 200_000
    # one session's calls running at once; more wait behind its own, so a flood cannot crowd other sessions out
    max_calls_per_session: Positive = 2
    # all sessions' calls running at once; past it a freed slot goes to the waiting session with the fewest
    # calls running (0: no cap)
    max_calls: NonNegative = 0
    # agent connections held at once: past a cap the one that has waited longest without a whole request is closed
    # (a new one is refused only when all are serving); 0: half the process's descriptor limit
    max_connections: NonNegative = 0
    max_connections_per_client: NonNegative = 0  # from one address (not loopback); 0: a quarter of the above
    context_length: NonNegative = (
        0  # tokens; a request that cannot fit gets 413 unrendered; 0: the model's own
    )
    default_max_tokens: Positive = 4096  # when a chat request gives no max_tokens
    # a call to a function the request did not offer is returned as a tool call (SGLang's
    # SGLANG_FORWARD_UNKNOWN_TOOLS); false: its block stays in the content, as the model wrote it
    forward_unknown_tools: bool = False
    # the model family's tool-call format, by SGLang's --tool-call-parser name (hermes, qwen25, qwen3_coder, glm45,
    # kimi_k2, deepseekv3, deepseekv31, gpt-oss, llama3, mistral); empty: detected from the chat template
    tool_parser: str = ""
    # its reasoning format, by SGLang's --reasoning-parser name (qwen3, deepseek-r1, deepseek-v3, glm45, kimi_k2,
    # mistral); empty: the family's, where its template or tokenizer knows the markers; "none": never parsed
    reasoning_parser: str = ""
    # how a later call follows an earlier one: "exact" continues from the ids the model was served and produced
    # (recording where the template's own render would differ); "canonical" renders such a call anew, a new branch
    continuation: Literal["exact", "canonical"] = "exact"


class SandboxConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The sandboxes in which agents run commands (``gyre.sandbox``)."""

    backend: Literal["bubblewrap", "local"] = "bubblewrap"  # local isolates nothing: development only
    workspace_root: str = ""  # where sandbox workspaces are created; empty: the system temp dir
    default_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 600.0  # wall clock of one command, unless given
    cpu_time_s: Positive = 900  # CPU seconds each process may use (RLIMIT_CPU)
    memory_mib: Positive = 4096  # a sandbox's processes together (cgroup), else each one's address space
    max_processes: Positive = 256  # processes and threads of one sandbox at once
    file_size_mib: Positive = 1024  # largest file a command may write (RLIMIT_FSIZE)
    open_files: Positive = 4096  # file descriptors per process (RLIMIT_NOFILE)
    output_limit_bytes: Positive = 262144  # stdout and stderr are each cut after this, with a marker
    network: bool = False  # True shares the host's network with the sandbox: no network isolation at all
    containment: Literal["auto", "cgroup", "uid", "rlimit"] = "auto"  # bounds processes (gyre.sandbox.limits)
    disk_quota_mib: Positive = (
        2048  # disk (blocks) files use in a workspace and its /tmp; past it the execution stops
    )
    max_inodes: Positive = 100_000  # files, directories and links in a workspace and its /tmp, likewise
    quota_check_s: Annotated[float, msgspec.Meta(gt=0)] = (
        2.0  # seconds between usage checks while an agent runs
    )
    copy_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0  # wall clock of one copy of a workspace out
    # bubblewrap: one long-lived sandbox per execution runs its commands (gyre.sandbox.commandserver); false: a new
    # bubblewrap per command (about 5 ms more each). The server stops after this many seconds without a command.
    command_server: bool = True
    server_idle_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    # command servers starting at once, driver-wide (the rest queue); 0: the host's CPU count. Thousands of
    # bubblewraps starting together flood the run queue and the kernel's namespace and cgroup locks, and the
    # driver's loop waits behind them (issue 17: loop lag p99 150 ms -> 26 ms at 2,000 executions).
    max_starting: NonNegative = 0
    # bubblewrap sandboxes' processes run this much nicer than the driver (`nice`), so a sandbox keeping the CPUs
    # busy cannot starve the loop that hosts every execution; 0: the driver's own priority
    nice: Annotated[int, msgspec.Meta(ge=0, le=19)] = 5
    # container sandboxes (`gyre.sandbox.container`): tasks naming an image; every sandbox when image is set
    image: str = ""  # a local image every sandbox runs in (a task's own replaces it); "": the backend's
    container_runtime: Literal["auto", "podman", "docker"] = "auto"  # auto: podman if it works, else docker
    container_cpus: Annotated[float, msgspec.Meta(ge=0)] = 0.0  # CPUs one command's container may use; 0: any
    # task environments (`gyre tasks prepare`): where they are built, by what, and how long one build may take
    env_cache_dir: str = ""  # empty: $GYRE_ENV_CACHE, else $XDG_CACHE_HOME/gyre/envs (~/.cache/gyre/envs)
    env_installer: Literal["auto", "uv", "pip"] = "auto"  # auto: uv when installed, else pip
    env_build_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 1800.0


class TrajectoryConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How finished executions become training data (``gyre.train``: trees, selection, weights, packing)."""

    jmax: NonNegative = 5  # most paths trained per execution; 0: unbounded
    packing: Literal["tree", "path"] = (
        "tree"  # tree: an execution's paths share one sequence (prefixes computed once)
    )
    micro_step_tokens: Positive = 8192  # token budget of one micro-step (a longer sequence gets its own)
    advantage: Literal["mean_std", "mean"] = "mean_std"  # group-relative: reward - group mean (/ group std)
    seed: int = 0  # path selection is seeded per execution from this
    # an execution whose advantage is 0 (its group scored alike) is not computed when the loss has no KL term: its
    # gradient is exactly 0 (gyre.train.step); false computes it anyway
    skip_zero_advantage: bool = True


class LossConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The training objectives (``gyre.train.objective``); ratios are exp(logprob - behaviour logprob)."""

    clip_low: Annotated[float, msgspec.Meta(ge=0.0, lt=1.0)] = 0.2  # ratio clipped below at 1 - clip_low
    clip_high: Annotated[float, msgspec.Meta(ge=0.0)] = 0.28  # ... and above at 1 + clip_high (clip-higher)
    tis_cap: Annotated[float, msgspec.Meta(ge=0.0)] = (
        2.0  # truncated importance sampling: a token's ratio weighs at most this much; 0: no cap
    )
    kl_coef: Annotated[float, msgspec.Meta(ge=0.0)] = (
        0.0  # weight of the k3 KL to the reference (nats); 0: off
    )
    supervised_coef: Annotated[float, msgspec.Meta(gt=0.0)] = 1.0  # weight of demonstrations' NLL (nats)
    temperature: Annotated[float, msgspec.Meta(gt=0.0)] = (
        1.0  # policy tokens' log-probabilities are of logits / this; gyre train sets run.agent_temperature
    )


class TrainerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The trainer processes (``gyre.train.coretrainer``, ``.satellite``): one core, any number of satellites."""

    model_path: str = ""  # Hugging Face model directory the core starts from (or a Gyre checkpoint)
    resume_from: str = ""  # a checkpoint directory (weights + optimizer + step); empty: fresh optimizer
    # a Gyre checkpoint (e.g. gyre sft's) whose AdamW moments a fresh run starts from, its weights from model_path
    # and its step and version from 0: the first updates are not sign-sized (a fresh Adam moves every weight by
    # about the learning rate); ignored when resume_from is set
    optimizer_from: str = ""
    # the core's ZeroMQ address; satellites and the driver connect here (a core cell binds cells.host, any port)
    bind: str = "tcp://127.0.0.1:5570"
    group_host: str = ""  # address satellites and engines reach the core's pair groups at; empty: bind's host
    # what computes gradients: Hugging Face models in torch, or Megatron-core models (tensor parallel); either way
    # weights, gradients and the optimizer are in Hugging Face layout, so members of both kinds join one step
    backend: Literal["torch", "megatron"] = "torch"
    # a Megatron member's processes: tensor-parallel ranks x pipeline stages (the core's, and satellites' from here)
    tensor_parallel: Positive = 1
    pipeline_parallel: Positive = 1
    # the core cell's data-parallel ranks (torch backend): each holds a model replica and computes; its fp32 master
    # weights, gradient sum and AdamW state are split over them (ZeRO-1); gyre.train.layout checks the layout fits
    ranks: Positive = 1
    # a micro-step longer than this is computed by all the core cell's ranks together, each holding 1/ranks of its
    # tokens (context parallelism, gyre.train.context); 0: never split
    max_tokens_per_rank: NonNegative = 0
    # where each rank of the core cell keeps its micro-steps' gradients until the step's one reduction
    # (gyre.train.sharded): float64 (the one process's update bit for bit; 8 bytes a parameter of the whole model),
    # float32 (half that, as Megatron's main_grad; within micro-steps x 2^-24 relative), rounds (no local sum: one
    # reduction per round of micro-steps, each moving the whole float64 model); auto: float64 over gloo, rounds over
    # nccl (a GPU holding a bf16 replica has no room for a whole-model sum beside its .grad)
    gradient_accumulation: Literal["auto", "float64", "float32", "rounds"] = "auto"

    @property
    def accumulation(self) -> Literal["float64", "float32", "rounds"]:
        """``gradient_accumulation`` with ``auto`` resolved by the collective."""
        if self.gradient_accumulation == "auto":
            return "rounds" if self.collective == "nccl" else "float64"
        return self.gradient_accumulation

    # recompute each decoder layer in backward instead of keeping its activations (torch backend; gyre.train.recompute):
    # a micro-step holds one layer's activations at a time, for about a third more compute
    activation_checkpointing: bool = False
    collective: Literal["gloo", "nccl"] = "gloo"  # torch.distributed backend of pair groups (nccl on GPUs)
    num_threads: NonNegative = 0  # torch threads per trainer process; 0: torch's default
    core_computes: bool = True  # the core claims micro-steps too (False: it only sums and applies)
    learning_rate: Annotated[float, msgspec.Meta(gt=0.0)] = 1e-5
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"  # after warm-up, towards lr_min_ratio
    lr_warmup_steps: NonNegative = 0  # steps of linear warm-up from 0
    lr_decay_steps: NonNegative = 0  # steps over which linear/cosine decay (0: constant after warm-up)
    lr_min_ratio: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.1  # final lr / learning_rate
    adam_beta1: Annotated[float, msgspec.Meta(ge=0.0, lt=1.0)] = 0.9
    adam_beta2: Annotated[float, msgspec.Meta(ge=0.0, lt=1.0)] = 0.999
    adam_eps: Annotated[float, msgspec.Meta(gt=0.0)] = 1e-8
    weight_decay: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0  # AdamW's decoupled decay per step, times lr
    grad_clip_norm: Annotated[float, msgspec.Meta(ge=0.0)] = 1.0  # global L2 norm cap; 0: no clipping
    heartbeat_s: Annotated[float, msgspec.Meta(gt=0.0)] = 0.5  # how often members and the core say "alive"
    member_timeout_s: Annotated[float, msgspec.Meta(gt=0.0)] = 5.0  # silence after which a member is gone
    transfer_timeout_s: Annotated[float, msgspec.Meta(gt=0.0)] = 60.0  # one weight/gradient transfer, at most
    # weight pushes to engines go in buckets of this size (a larger tensor alone): a push costs a bucket, not a model
    bucket_mib: Annotated[float, msgspec.Meta(gt=0.0)] = 512.0
    checkpoint_every_steps: NonNegative = 0  # write checkpoint_dir/step-N after every N steps; 0: never
    checkpoint_dir: str = ""
    seed: int = 0  # torch's seed in every trainer process (dropout, if a model has any)
    modelled_tokens_per_s: Annotated[float, msgspec.Meta(ge=0.0)] = (
        0.0  # every member computes at most this many tokens a second (a modelled accelerator); 0: off
    )
    modelled_push_s: Annotated[float, msgspec.Meta(ge=0.0)] = (
        0.0  # every weight push to an engine takes at least this long (a modelled transfer of a big model); 0: off
    )
    loss: LossConfig = msgspec.field(default_factory=LossConfig)

    def __post_init__(self) -> None:
        """Refuse what the chosen backend cannot do (msgspec reports the ValueError as this section's)."""
        if self.activation_checkpointing and self.backend == "megatron":
            raise ValueError(
                "trainer.activation_checkpointing is built for trainer.backend = 'torch' only (Megatron's recompute"
                " is not wired in yet); set trainer.backend = 'torch', or activation_checkpointing = false"
            )


class CellsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The cells: one process each, owning an inference engine and a trainer, serving or training on command."""

    count: Positive = 2  # cells that serve and train: cell-0 is the core, then satellites in training order
    standalone: NonNegative = 0  # extra cells that only serve (never train); moved calls go there first
    capacity_executions: Positive = 16  # executions one serving cell hosts at once (the policy's C_e)
    engine_backend: Literal["embedded", "sglang"] = "embedded"
    engine_overrides: list[str] = msgspec.field(
        default_factory=list
    )  # each embedded engine's dotted overrides
    release_weights: bool = True  # serve -> train frees the engine's weights too, not only its KV cache
    num_threads: NonNegative = 0  # torch threads of each cell's trainer; 0: torch's default
    startup_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 180.0  # a cell's engine and trainer come up
    # this machine's address as the other machines see it: a cell's engine and core trainer listen here, and the
    # controller, router, driver and other cells reach them here (gyre cell --host); loopback: one machine only
    host: str = "127.0.0.1"


class ControllerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The elastic controller: its policy (the same object ``gyre sim`` drives) and its ZeroMQ control plane."""

    mode: Literal["elastic", "colocate", "async", "onestep"] = "elastic"
    overlap: bool = True  # elastic: dispatch the next burst into capacity the tail frees
    max_staleness: Annotated[int, msgspec.Meta(ge=0)] = 1  # versions between sampling and training
    async_train_cells: Positive = 1  # async, onestep: cells that always train (the first in order)
    # a step trains the first whole groups to finish; the others run on across its update (their later calls sample
    # the new weights) into a later step: no step waits for its slowest execution (not yet resumable)
    carry_over: bool = False
    bind: str = "tcp://127.0.0.1:0"  # the controller's ROUTER; port 0: any free one; cells connect here
    heartbeat_s: Annotated[float, msgspec.Meta(gt=0.0)] = (
        0.5  # how often cells and the controller say "alive"
    )
    cell_timeout_s: Annotated[float, msgspec.Meta(gt=0.0)] = 5.0  # silence after which a cell is gone
    switch_timeout_s: Annotated[float, msgspec.Meta(gt=0.0)] = 300.0  # one role switch, at most


class ChaosConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Faults injected on purpose, to show that a run survives them (`gyre.control.chaos`); all off by default.

    Each message between the controller and a cell (both ways, heartbeats included) is dropped, duplicated, and
    delayed (which reorders messages) with these probabilities, seeded per side; the driver's submits to the core and
    the verifier's sandbox starts fail likewise.
    """

    control_drop: Annotated[float, msgspec.Meta(ge=0.0, lt=1.0)] = 0.0
    control_duplicate: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.0
    control_delay_s: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0  # each message waits uniformly up to this
    seed: int = 0
    # the driver's SubmitMicroSteps to the core trainer: lost (the request or its answer, half each: the driver asks
    # again with the same submission id) or duplicated (a second copy reaches the core) with these probabilities
    trainer_drop: Annotated[float, msgspec.Meta(ge=0.0, lt=1.0)] = 0.0
    trainer_duplicate: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.0
    # each start of a verifier's sandbox (every attempt of every execution's verification) fails with this probability,
    # seeded per execution id and attempt: the verifier retries, and an execution whose every attempt failed is
    # dropped from training as unverified (never scored 0)
    verifier_start_fail: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.0


class RunConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What `gyre train` runs: the model, the task suite, the steps and their executions, the built-in agent."""

    model_path: str = "models/tiny"  # the Hugging Face model directory trained (and served by every cell)
    suite: str = "toy:64"  # a built-in suite (toy, toy:N[:SEED], nl2repo-mini) or a suite/task directory
    run_dir: str = ""  # the run directory; empty: runs/train-<suite>-<time>
    steps: Positive = 4  # optimizer steps
    tasks_per_step: Positive = 8  # tasks sampled (without replacement, then again) for each step
    group_size: Positive = 4  # executions per task in a step (group-relative advantages)
    burst_steps: Positive = 1  # steps dispatched together as one burst
    seed: int = 0  # task order
    agent_max_calls: Positive = 16  # the built-in agent's model calls per execution (main context)
    agent_max_tokens: Positive = 512  # per call
    agent_temperature: Annotated[float, msgspec.Meta(ge=0.0)] = 1.0
    agent: str = "builtin"  # builtin | command:ARGV (a process) | python:MODULE:ATTR (a callable); all train
    agent_profile: Literal["default", "lean"] = "default"  # the built-in agent's prompt (lean: bash + submit)
    agent_max_idle_calls: NonNegative = (
        0  # the built-in agent gives up after N calls in a row call no tool; 0: never
    )
    eval_suite: str = ""  # a held-out suite evaluated while training (`gyre eval` semantics); empty: none
    eval_every: NonNegative = (
        0  # evaluate after every N applied steps (and before the first and after the last)
    )
    eval_tasks: NonNegative = 0  # the eval suite's first N tasks; 0: all
    eval_samples: Positive = 1  # executions per eval task
    eval_temperature: Annotated[float, msgspec.Meta(ge=0.0)] | None = None  # None: agent_temperature
    # the held-out executions' sampling seed: every evaluation point draws the same random numbers for the same
    # task, so two points compare pairwise (`gyre.driver.evaluation.paired_difference`); None: unseeded
    eval_seed: int | None = 0

    @property
    def batch_executions(self) -> int:
        """Executions per step."""
        return self.tasks_per_step * self.group_size


class SftConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`gyre sft`: a supervised warm start on demonstration call records (``gyre.driver.sft``).

    AdamW's other settings (betas, eps, weight decay, gradient clipping, ``lr_min_ratio``) and the torch threads
    come from ``[trainer]``; the loss is the plain negative log-likelihood of the demonstrated output tokens. With
    ``window_tokens`` and ``window_steps`` set, a window stage (short windows, constant learning rate after
    warm-up) runs first; ``lr_schedule`` then decays over the epochs' steps.
    """

    model_path: str = "models/tiny"  # the Hugging Face model directory (or Gyre checkpoint) to start from
    journals: list[str] = msgspec.field(default_factory=list)  # calls.jsonl files, journal or run directories
    sources: list[RecordSource] = msgspec.field(
        default_factory=lambda: ["scripted"]
    )  # records whose output counts as a demonstration: scripted (an expert's), policy, upstream
    output_dir: str = ""  # where metrics.jsonl, sft.json and checkpoints/step-N go; empty: runs/sft-<time>
    epochs: NonNegative = 1  # passes over the demonstrations; 0: the window stage only
    batch_sessions: Positive = 8  # demonstration sessions (executions) per optimizer step
    micro_step_tokens: Positive = (
        8192  # a step's sessions are folded into prefix trees of at most this many tokens, one forward each
    )
    max_seq_len: NonNegative = 0  # calls longer than this (input + output tokens) are left out; 0: the model's max_position_embeddings
    learning_rate: Annotated[float, msgspec.Meta(gt=0.0)] = 1e-3
    lr_warmup_steps: NonNegative = 0  # steps of linear warm-up from 0
    lr_schedule: Literal["constant", "linear", "cosine"] = (
        "cosine"  # after warm-up, decaying over the remaining steps to trainer.lr_min_ratio
    )
    seed: int = 0  # the session order of every epoch, and torch's seed
    checkpoint_every_steps: NonNegative = 0  # also write checkpoints/step-N every N steps; 0: only the last
    window_tokens: NonNegative = 0  # window stage: at most N tokens up to each trained span; 0: none
    window_steps: NonNegative = 0  # optimizer steps of the window stage, run before the epochs
    window_batch: Positive = 32  # windows per window-stage step, computed in one forward
    window_focus: list[Literal["output", "copied"]] = msgspec.field(
        default_factory=lambda: ["output"]
    )  # what windows train: whole outputs, spans an output copies from its latest observation, or both
    window_copy_min: Positive = 3  # copied spans: pieces of at least N tokens found in the observation


class ShardsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Runtime shards (`gyre.runtime.shards`): each a process hosting a runtime (executions, their sandboxes and
    verifiers) and a router for its own sessions. 0: the driver runs every execution itself, as on one machine."""

    count: NonNegative = 0
    bind: str = "tcp://127.0.0.1:0"  # the driver's shard hub; port 0: any free one; shards connect here
    report_s: Annotated[float, msgspec.Meta(gt=0.0)] = (
        0.5  # how often a shard sends its counts (and is heard)
    )
    timeout_s: Annotated[float, msgspec.Meta(gt=0.0)] = 10.0  # silence after which a shard is lost
    startup_timeout_s: Annotated[float, msgspec.Meta(gt=0.0)] = 120.0  # every shard connected
    reruns: NonNegative = (
        2  # times an execution whose shard was lost runs again on another (then it is dropped)
    )


class RayConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where ``--ray`` places processes (`gyre.control.placement`): one placement group for the cells, one for the
    shards. Resources are Ray's: ``GPU``, ``CPU`` and the custom ones a cluster's nodes declare."""

    cell_gpus: Annotated[float, msgspec.Meta(ge=0.0)] = 1.0  # each cell's devices (0: a CPU cell)
    cell_cpus: Annotated[float, msgspec.Meta(ge=0.0)] = 1.0
    cell_resources: dict[str, float] = msgspec.field(default_factory=dict)  # e.g. {accelerator_node = 1}
    shard_cpus: Annotated[float, msgspec.Meta(ge=0.0)] = 1.0
    shard_resources: dict[str, float] = msgspec.field(default_factory=dict)
    cell_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    shard_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "SPREAD"
    placement_timeout_s: Annotated[float, msgspec.Meta(gt=0.0)] = (
        300.0  # the cluster has room for both groups
    )


class GyreConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One run's whole configuration: one TOML file."""

    engine: EngineConfig = msgspec.field(default_factory=EngineConfig)
    router: RouterConfig = msgspec.field(default_factory=RouterConfig)
    sandbox: SandboxConfig = msgspec.field(default_factory=SandboxConfig)
    trajectory: TrajectoryConfig = msgspec.field(default_factory=TrajectoryConfig)
    trainer: TrainerConfig = msgspec.field(default_factory=TrainerConfig)
    cells: CellsConfig = msgspec.field(default_factory=CellsConfig)
    controller: ControllerConfig = msgspec.field(default_factory=ControllerConfig)
    run: RunConfig = msgspec.field(default_factory=RunConfig)
    sft: SftConfig = msgspec.field(default_factory=SftConfig)
    chaos: ChaosConfig = msgspec.field(default_factory=ChaosConfig)
    shards: ShardsConfig = msgspec.field(default_factory=ShardsConfig)
    ray: RayConfig = msgspec.field(default_factory=RayConfig)


T = TypeVar("T", bound=msgspec.Struct)


def _parse_value(text: str) -> Any:
    """A TOML literal (``3``, ``true``, ``"x"``, ``[1, 2]``), else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to a TOML-shaped dict (in place) and return it."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form section.key=value")
        *parents, leaf = key.strip().split(".")
        node = data
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
            node = child
        node[leaf] = _parse_value(value.strip())
    return data


# keys that were renamed: refused, naming the new one (section, old key) -> new dotted key and why
RENAMED = {
    ("trainer", "shards"): (
        "trainer.ranks",
        "the core cell's data-parallel ranks; 'shards' now names the runtime's shards only ([shards])",
    ),
}


def convert(data: dict[str, Any], type_: type[T], source: str = "config") -> T:
    """Validate a TOML-shaped dict into a config Struct; the error names the offending field (and a renamed key's
    new name)."""
    for (section, key), (new, why) in RENAMED.items():
        table = data.get(section)
        if isinstance(table, dict) and key in table:
            raise ConfigError(f"{source}: {section}.{key} is now {new} ({why}): rename it")
    try:
        return msgspec.convert(data, type_)
    except msgspec.ValidationError as exc:
        trainer = data.get("trainer")
        hint = ""
        if isinstance(trainer, dict) and trainer.get("backend") in ("gloo", "nccl"):  # a config from before
            hint = (
                " (trainer.backend names what computes gradients now; gloo/nccl moved to trainer.collective)"
            )
        raise ConfigError(f"{source}: {exc}{hint}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> GyreConfig:
    """Load a run's config from TOML (or defaults when ``path`` is None) and apply dotted overrides."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            data = tomllib.loads(Path(path).read_bytes().decode("utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except OSError as exc:
            raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{path} is not UTF-8 text (TOML must be): {exc.reason} at byte {exc.start}"
            ) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    apply_overrides(data, overrides or [])
    return convert(data, GyreConfig, source)


def dump_config(config: msgspec.Struct) -> str:
    """The resolved config as TOML text (what a run directory keeps as ``config.toml``)."""
    return _to_toml(msgspec.to_builtins(config))


def _to_toml(data: dict[str, Any], prefix: str = "") -> str:
    scalars = [  # TOML has no null: a None is left out (its default, None, comes back on loading)
        f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict) and v is not None
    ]
    text = (f"[{prefix}]\n" if prefix and scalars else "") + "".join(line + "\n" for line in scalars)
    for key, value in data.items():
        if isinstance(value, dict):
            text += ("\n" if text else "") + _to_toml(value, f"{prefix}.{key}" if prefix else key)
    return text


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):  # JSON escaping is valid TOML, except DEL which TOML also forbids raw
        return msgspec.json.encode(value).decode().replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)

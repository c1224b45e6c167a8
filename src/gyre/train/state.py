"""The core's training state: authoritative weights, the only optimizer state, step, version; checkpoints.

Gradients of a step are summed into one float64 buffer laid out like ``flat_parameters`` (parameters in
``named_parameters`` order, each flattened), whichever process computed them: summing in float64 makes the result
independent of the order in which micro-steps arrive, so an elastic step matches one process computing the whole
batch. ``apply`` turns the sum into one AdamW update and bumps the weight version.

A checkpoint (``gyre.train.checkpoint``) is a directory that loads as a Hugging Face model (``config.json``, the
weights streamed into safetensors files, the tokenizer files of the source model, so ``gyre serve-engine`` and
transformers read it) plus ``optimizer/`` (fp32 master weights and AdamW's moments and step count as flat buffers,
which a sharded core of any size loads) and ``trainer_state.json`` (step, version, the driver's data cursor, the
step's metrics). Resuming from it gives the same next update, bit for bit, as not stopping; earlier checkpoints (one
``optimizer.safetensors``) still load.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from gyre.config import TrainerConfig
from gyre.errors import ConfigError
from gyre.train import checkpoint, recompute


def load_model(directory: str | Path) -> Any:
    """A Hugging Face causal LM from ``directory`` in float32, in training mode."""
    from transformers import AutoModelForCausalLM

    path = Path(directory)
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path} is not a Hugging Face model directory (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    return model.train()


def model_from_config(config: dict[str, Any]) -> Any:
    """A model of the architecture in a ``config.json`` dict, weights left uninitialised (a satellite's, before the
    core's weights arrive: random initialisation of 25 M parameters alone would cost a second of its join)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers
        from transformers.modeling_utils import no_init_weights  # type: ignore[attr-defined,no-redef]

    with no_init_weights():
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config), dtype=torch.float32)
    model.tie_weights()  # skipped without initialisation; the core's layout has tied weights once
    return model.train()


def parameters(model: Any) -> list[tuple[str, torch.Tensor]]:
    """The trained parameters in the order every member lays out weights and gradients."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def flatten_parameters(model: Any) -> torch.Tensor:
    """Move every trained parameter into one contiguous buffer (each becomes a view of it) and return the buffer.

    Every member lays its weights out this way, in ``parameters`` order, so the step's weights travel from the
    core to a satellite as one broadcast with no copy on either side, and to an engine as one flattened bucket.
    """
    named = parameters(model)
    first = named[0][1]
    flat = torch.empty(sum(p.numel() for _, p in named), dtype=first.dtype, device=first.device)
    offset = 0
    for _, p in named:
        if p.dtype != flat.dtype:
            raise ConfigError(f"the model mixes parameter dtypes ({p.dtype}, {flat.dtype}); train one dtype")
        view = flat[offset : offset + p.numel()]
        view.copy_(p.detach().reshape(-1))
        p.data = view.view_as(p)
        offset += p.numel()
    return flat


def flat_gradient(model: Any) -> torch.Tensor:
    """All parameters' gradients as one float32 vector (zeros where a parameter has none)."""
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for _, p in parameters(model)]
    )


def lr_at(cfg: TrainerConfig, step: int) -> float:
    """The learning rate of update ``step`` (0-based): linear warm-up, then the schedule."""
    if step < cfg.lr_warmup_steps:
        return cfg.learning_rate * (step + 1) / cfg.lr_warmup_steps
    if cfg.lr_schedule == "constant" or cfg.lr_decay_steps == 0:
        return cfg.learning_rate
    progress = min((step - cfg.lr_warmup_steps) / cfg.lr_decay_steps, 1.0)
    shape = 1 - progress if cfg.lr_schedule == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.learning_rate * (cfg.lr_min_ratio + (1 - cfg.lr_min_ratio) * shape)


class TrainState:
    """The core's weights, AdamW state, gradient sum, step and version."""

    def __init__(self, cfg: TrainerConfig) -> None:
        self.cfg = cfg
        source = cfg.resume_from or cfg.model_path
        if not source:
            raise ConfigError("trainer.model_path is empty: name the Hugging Face model directory to train")
        self.source = Path(source)
        self.model = load_model(source)
        if cfg.activation_checkpointing:
            recompute.enable(self.model)
        self.flat = flatten_parameters(self.model)  # the weights members receive, one buffer
        self.named = parameters(self.model)
        self.numel = sum(p.numel() for _, p in self.named)
        self.optimizer = torch.optim.AdamW(
            [p for _, p in self.named],
            lr=cfg.learning_rate,
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
            foreach=False,
        )
        self.gradient_sum = torch.zeros(self.numel, dtype=torch.float64)
        self.step = 0  # optimizer updates applied
        self.version = 0  # weight version of the current weights
        self.data_cursor: dict[str, Any] = {}
        self.last_metrics: dict[str, Any] = {}  # the last applied step's StepMetrics (as builtins)
        self.reference: Any | None = None
        self.reference_flat: torch.Tensor | None = None
        if cfg.resume_from:
            self._load(Path(cfg.resume_from))
        elif cfg.optimizer_from:
            self._load_moments(Path(cfg.optimizer_from))
        if cfg.loss.kl_coef > 0:
            self.reference = load_model(cfg.model_path or source).eval()
            self.reference_flat = flatten_parameters(self.reference)
            self.reference.requires_grad_(False)

    # ---- gradients ------------------------------------------------------------------------------------------
    def add(self, flat: torch.Tensor) -> None:
        """Add one micro-step's flat float32 gradient to the step's sum (caller serialises)."""
        if flat.numel() != self.numel:
            raise ValueError(f"a gradient of {flat.numel()} values for a model of {self.numel}")
        self.gradient_sum.add_(flat.to(torch.float64))

    def lr_at(self, step: int) -> float:
        """The learning rate of update ``step`` (``lr_at``; a subclass may shift the schedule)."""
        return lr_at(self.cfg, step)

    def add_range(self, start: int, values: torch.Tensor) -> None:
        """Add ``values`` (float64) for flat positions ``start, start + 1, ...`` (a member's sum, or a piece of it)."""
        if not 0 <= start <= start + values.numel() <= self.numel:
            raise ValueError(
                f"positions [{start}, {start + values.numel()}) are outside a model of {self.numel}"
            )
        self.gradient_sum[start : start + values.numel()].add_(values.reshape(-1))

    def add_model_gradients(self) -> None:
        """Move the core's own ``.grad`` into the sum and clear it."""
        self.add(flat_gradient(self.model))
        self.model.zero_grad(set_to_none=True)

    def apply(self) -> tuple[float, float]:
        """One AdamW update from the gradient sum; clears it, bumps step and version. Returns (grad norm, lr)."""
        summed = self.gradient_sum.to(torch.float32)
        offset = 0
        for _, p in self.named:
            p.grad = summed[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        params = [p for _, p in self.named]
        if self.cfg.grad_clip_norm > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip_norm, foreach=False))
        else:
            norm = float(torch.linalg.vector_norm(summed))
        lr = self.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.model.zero_grad(set_to_none=True)
        self.gradient_sum.zero_()
        self.step += 1
        self.version += 1
        return norm, lr

    def skip(self) -> float:
        """A step that trained nothing: no update (weights and AdamW moments unchanged), but step and version move
        on, so versions keep counting steps. Returns the learning rate the step would have had."""
        lr = self.lr_at(self.step)
        self.gradient_sum.zero_()
        self.step += 1
        self.version += 1
        return lr

    # ---- checkpoints ----------------------------------------------------------------------------------------
    def flat_state(self) -> dict[str, torch.Tensor]:
        """The weights and AdamW state in the flat layout of sharded checkpoints (``gyre.train.checkpoint``): fp32
        ``master`` weights, and once an update has run, ``exp_avg``, ``exp_avg_sq`` (copies) and the 0-d ``step``."""
        out = {"master": self.flat.detach()}
        states = [self.optimizer.state.get(p, {}) for _, p in self.named]
        if not any(states):
            return out
        if not all(states) or len({float(s["step"]) for s in states}) != 1:
            raise RuntimeError(
                "AdamW state is uneven over the parameters; the flat layout holds one step count"
            )
        for key in ("exp_avg", "exp_avg_sq"):
            out[key] = torch.cat([s[key].detach().reshape(-1) for s in states])
        out["step"] = states[0]["step"].detach().clone()
        return out

    def save(self, directory: str | Path, *, max_shard_bytes: int = checkpoint.MAX_SHARD_BYTES) -> Path:
        """Write a checkpoint (see ``gyre.train.checkpoint.save_checkpoint``); replaces what ``directory`` held."""
        state = {"step": self.step, "version": self.version, "data_cursor": self.data_cursor,
                 "metrics": self.last_metrics, "parameters": [n for n, _ in self.named]}  # fmt: skip
        return checkpoint.save_checkpoint(
            directory, config=self.model.config, source=self.source, tensors=checkpoint.model_tensors(self.model),
            flat=self.flat_state(), numel=self.numel, state=state, max_shard_bytes=max_shard_bytes,
        )  # fmt: skip

    def _load(self, path: Path) -> None:
        state = self._load_moments(path, weights=True)
        self.step, self.version = int(state["step"]), int(state["version"])
        self.data_cursor = dict(state.get("data_cursor") or {})

    def _load_moments(self, path: Path, weights: bool = False) -> dict[str, Any]:
        """The AdamW state of the checkpoint at ``path`` into this optimizer (and with ``weights`` its fp32 master
        weights, where it has them); returns its trainer state. Reads sharded checkpoints, saved by any number of
        ranks, and the single-file ``optimizer.safetensors`` of earlier ones."""
        state = checkpoint.read_state(path)
        if state.get("parameters") != [n for n, _ in self.named]:
            raise ConfigError(f"{path}: its optimizer state is for other parameters than the model's")
        if (path / checkpoint.OPTIMIZER_DIR).is_dir():
            flat = checkpoint.load_flat_state(path / checkpoint.OPTIMIZER_DIR, self.numel)
            if weights and "master" in flat:
                self.flat.copy_(flat["master"])
            if "exp_avg" in flat:
                offset = 0
                for _, p in self.named:
                    part = slice(offset, offset + p.numel())
                    self.optimizer.state[p] = {"step": flat["step"].clone(), "exp_avg": flat["exp_avg"][part].view_as(p),
                                               "exp_avg_sq": flat["exp_avg_sq"][part].view_as(p)}  # fmt: skip
                    offset += p.numel()
            return state
        from safetensors.torch import load_file

        moments = load_file(str(path / checkpoint.LEGACY_OPTIMIZER_FILE))
        for i, (_, p) in enumerate(self.named):
            entry = {key.split(".", 1)[1]: v for key, v in moments.items() if key.split(".", 1)[0] == str(i)}
            if entry:
                self.optimizer.state[p] = entry
        return state

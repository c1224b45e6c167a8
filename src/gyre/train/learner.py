"""What computes a member's gradients: one interface, a backend each (``trainer.backend``: torch or megatron).

Members exchange weights and gradients with the core in one layout, the Hugging Face model's trained parameters
flattened in ``named_parameters`` order, whatever computes them. So an elastic step can mix backends (a Megatron core
with torch satellites, or the reverse), the core's AdamW and checkpoints stay in Hugging Face form, and a weight push
to an engine is the core's flat buffer as it is.

A learner's life: ``weights()`` is the buffer the step's weights are received into, ``loaded(version)`` after they
are in; ``compute`` accumulates one micro-step's gradient; ``gradient()`` returns the sum since the last call (float32,
the exchange layout) and clears it. ``load_reference`` takes the frozen reference model's weights (for the KL term).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from gyre.config import LossConfig
from gyre.errors import ConfigError
from gyre.protocol import MicroStats, MicroStep
from gyre.train import recompute
from gyre.train.objective import compute_gradients
from gyre.train.state import flat_gradient, flatten_parameters, model_from_config


class Learner(Protocol):
    """A member's model, in whatever form its backend computes with (see the module)."""

    version: int  # the weights it holds (-1: none yet)
    numel: int  # values in the exchange layout

    def weights(self) -> torch.Tensor: ...
    def loaded(self, version: int) -> None: ...
    def load_reference(self, flat: torch.Tensor) -> None: ...
    def compute(self, micro: MicroStep, loss: LossConfig, version: int) -> MicroStats: ...
    def gradient(self) -> torch.Tensor: ...
    def close(self) -> None: ...


class TorchLearner:
    """A Hugging Face model computing in this process; its parameters are views of ``weights()``."""

    def __init__(self, model: Any, flat: torch.Tensor | None = None) -> None:
        self.model = model
        self.flat = flat if flat is not None else flatten_parameters(model)
        self.numel = self.flat.numel()
        self.version = -1
        self.reference: Any | None = None

    @classmethod
    def from_config(
        cls, model_config: dict[str, Any], activation_checkpointing: bool = False, device: str = "cpu"
    ) -> TorchLearner:
        """A learner of the architecture in ``model_config`` (weights arrive from the core) on ``device``, its decoder
        layers recomputed in backward with ``activation_checkpointing`` (`gyre.train.recompute`)."""
        # moved before flattening: its parameters become views of one buffer on the device
        model = model_from_config(model_config).to(device)
        if activation_checkpointing:
            recompute.enable(model)
        return cls(model)

    def weights(self) -> torch.Tensor:
        return self.flat

    def loaded(self, version: int) -> None:
        self.version = version

    def load_reference(self, flat: torch.Tensor) -> None:
        reference = model_from_config(self.model.config.to_dict()).to(self.flat.device).eval()
        flatten_parameters(reference).copy_(
            flat
        )  # (flattening takes the trained parameters only: before freezing)
        self.reference = reference.requires_grad_(False)

    def compute(self, micro: MicroStep, loss: LossConfig, version: int) -> MicroStats:
        return compute_gradients(self.model, micro, loss, version, self.reference)

    def gradient(self) -> torch.Tensor:
        flat = flat_gradient(self.model)
        self.model.zero_grad(set_to_none=True)
        return flat

    def close(self) -> None:
        pass


def make_learner(
    backend: str, model_config: dict[str, Any], tensor_parallel: int = 1, pipeline_parallel: int = 1,
    num_threads: int = 0, activation_checkpointing: bool = False, device: str = "cpu",
) -> Learner:  # fmt: skip
    """A learner of ``backend`` for the architecture in ``model_config`` (weights arrive later); a torch one on
    ``device``."""
    if backend == "torch":
        if tensor_parallel != 1 or pipeline_parallel != 1:
            raise ConfigError("tensor_parallel or pipeline_parallel > 1 needs trainer.backend = 'megatron'")
        return TorchLearner.from_config(model_config, activation_checkpointing, device)
    if backend == "megatron":
        if activation_checkpointing:
            raise ConfigError(
                "the core trains with trainer.activation_checkpointing, which the megatron backend does not do yet; "
                "run this member with backend 'torch'"
            )
        from gyre.train.megatron.member import MegatronLearner

        return MegatronLearner(model_config, tensor_parallel, pipeline_parallel, num_threads)
    raise ConfigError(f"unknown trainer backend {backend!r}: torch or megatron")

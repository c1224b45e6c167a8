"""Megatron-core on a machine without CUDA: the two adjustments it needs, and its process groups.

megatron-core runs forward and backward on CPU over gloo with its local (non-Transformer-Engine) layer spec, except
for two places that assume a GPU (measured with megatron-core 0.16):

- its global memory buffer (scratch tensors: its own attention's scores, sequence-parallel gathers) allocates on
  ``torch.cuda.current_device()``; without CUDA it gets a buffer that allocates on the CPU;
- its RNG tracker forks CUDA generator states around dropout; without CUDA it gets the *inference* tracker, whose
  ``fork`` does nothing (Gyre trains without dropout, so nothing is lost).

Both are applied by `init_parallel` only when CUDA is unavailable. Everything else about Megatron on CPU is left as it
is: its DDP wrapper and distributed optimizer need CUDA, so Gyre sums gradients itself (in the core, in Hugging Face
layout) and applies torch's AdamW there, as for the torch backend.

One process holds one layout: the default process group is this member's processes, tensor x pipeline (Gyre's pair
groups with the core never use the default group).
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import torch
import torch.distributed as dist

from gyre.errors import ConfigError

_initialised: tuple[int, int, int] | None = None  # (rank, tensor, pipeline) of this process's member


def import_megatron() -> Any:
    """``megatron.core``, imported with its warnings about itself silenced for this process: deprecations inside
    megatron-core (0.16 warns of its own APIs on every forward) and missing Transformer Engine and Apex (not used)."""
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"megatron\.")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"megatron\.")
    warnings.filterwarnings(
        "ignore",
        category=UserWarning,
        module=r"megatron\.",
        message=".*(Transformer ?Engine|Apex|full scope)",
    )
    try:
        with warnings.catch_warnings():  # what it imports warns too (torch.jit's deprecations)
            warnings.simplefilter("ignore", DeprecationWarning)
            import megatron.core
            import megatron.core.models.gpt
            import megatron.core.models.gpt.gpt_layer_specs
    except ImportError as exc:
        raise ConfigError(
            f"trainer.backend = 'megatron' needs megatron-core ({exc}); pip install 'gyre[megatron]'"
        ) from exc
    return megatron.core


def init_parallel(
    rank: int,
    address: str,
    tensor: int = 1,
    pipeline: int = 1,
    backend: str = "gloo",
    timeout_s: float = 600.0,
) -> None:
    """Make this process rank ``rank`` of a member of ``tensor`` x ``pipeline`` processes rendezvousing at
    ``address`` (``tcp://HOST:PORT``, hosted by rank 0); Megatron's layout: rank = stage * tensor + tensor rank.
    Idempotent for the same layout."""
    global _initialised
    layout = (rank, tensor, pipeline)
    if _initialised is not None:
        if _initialised != layout:
            raise ConfigError(
                f"this process is rank {_initialised[0]} of a {_initialised[1]} x {_initialised[2]} (tensor x "
                f"pipeline) member already; one process holds one layout (asked for {layout})"
            )
        return
    import_megatron()
    from datetime import timedelta

    from megatron.core import parallel_state

    if (
        not torch.cuda.is_available()
    ):  # read by CUDA streams only; set, it silences a warning on every TP layer
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    if not dist.is_initialized():
        os.environ.setdefault("LOCAL_RANK", str(rank))
        dist.init_process_group(
            backend,
            init_method=address,
            rank=rank,
            world_size=tensor * pipeline,
            timeout=timedelta(seconds=timeout_s),
        )
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tensor, pipeline_model_parallel_size=pipeline
    )
    if not torch.cuda.is_available():
        _adjust_for_cpu()
    _initialised = layout


def _adjust_for_cpu() -> None:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random
    from megatron.core.utils import GlobalMemoryBuffer

    class CpuMemoryBuffer(GlobalMemoryBuffer):
        """Megatron's buffer allocates on CUDA; here, on the CPU."""

        def get_tensor(self, tensor_shape: Any, dtype: Any, name: Any, mem_alloc_context: Any = None) -> Any:
            numel = math.prod(int(n) for n in tensor_shape)
            held = self.buffer.get((name, dtype))
            if held is None or held.numel() < numel:
                held = self.buffer[(name, dtype)] = torch.empty(numel, dtype=dtype)
            return held[:numel].view(*tensor_shape)

    parallel_state._GLOBAL_MEMORY_BUFFER = CpuMemoryBuffer()
    random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


def parallel_layout() -> tuple[int, int, int]:
    """(rank, tensor, pipeline) of this process's member; (0, 1, 1) before `init_parallel`."""
    return _initialised or (0, 1, 1)

"""Where and how the embedded engine computes: device, dtype, CPU threads, allocator behaviour."""

from __future__ import annotations

import ctypes

import torch

from gyre.config import EngineConfig
from gyre.engine.embedded.transformer import ModelSpec
from gyre.errors import ConfigError


def resolve_device(cfg: EngineConfig) -> tuple[torch.device, torch.dtype]:
    """Device and dtype from the config: cuda when present (bf16), else cpu (fp32)."""
    device = cfg.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("engine.device = 'cuda' but no CUDA device is available")
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    dtype = dtypes.get(cfg.dtype) or (torch.bfloat16 if device == "cuda" else torch.float32)
    return torch.device(device), dtype


def keep_freed_memory_in_heap() -> None:
    """Stop glibc from returning large freed buffers to the OS (process-wide).

    Every decode step allocates and frees buffers of megabytes (gathered KV, attention scratch). By default glibc
    serves those with fresh mmap pages, and faulting them in again each step cost more than the step's arithmetic
    (5x at 128 concurrent requests, benchmarks/engine.py). Keeping them in the heap trades resident memory for that.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc: nothing to tune
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 32 * 2**20)  # glibc's maximum: allocations below 32 MiB come from the heap
    libc.mallopt(m_trim_threshold, 2**30)  # keep up to 1 GiB of freed heap instead of trimming it


def auto_threads(spec: ModelSpec) -> int:
    """Intra-op threads only pay off when matmuls are large; a small model runs fastest on one."""
    params = spec.num_layers * (
        4 * spec.hidden_size * spec.num_heads * spec.head_dim + 3 * spec.hidden_size * spec.intermediate_size
    )
    return 1 if params < 50_000_000 else torch.get_num_threads()

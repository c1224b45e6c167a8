"""Peak extra memory of writing a model's Hugging Face weights: streamed (``gyre.train.checkpoint.export_weights``,
tensor by tensor into sharded files) against the whole-dict ``safetensors.torch.save_file`` Gyre used before.

The tensors come from a generator that makes each one when asked (as a sharded core gathers each from its shards),
so the streamed export holds one at a time; the whole-dict save has to hold them all. Peak memory is the process's
resident peak (``VmHWM``, reset through ``/proc/self/clear_refs`` before each run) less its resident size before.

    .venv/bin/python benchmarks/checkpoint_export.py --model-mib 512 --tensor-mib 16 --shard-mib 128
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch


def _status(field: str) -> int:
    """A ``/proc/self/status`` figure, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _tensors(model_mib: float, tensor_mib: float) -> Iterator[tuple[str, torch.Tensor]]:
    count, numel = round(model_mib / tensor_mib), int(tensor_mib * 2**20) // 4
    for i in range(count):
        yield f"model.layers.{i}.weight", torch.full((numel,), float(i))


def measure(
    kind: str, model_mib: float, tensor_mib: float, shard_mib: float, directory: Path
) -> dict[str, float]:
    """One run of ``kind`` (``streamed`` or ``whole``): its peak extra resident memory and time."""
    from safetensors.torch import save_file

    from gyre.train.checkpoint import export_weights

    torch.full((1,), 0.0)  # torch's first allocation, not counted
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before, began = _status("VmRSS"), time.perf_counter()
    if kind == "streamed":
        files = export_weights(
            directory, _tensors(model_mib, tensor_mib), max_shard_bytes=int(shard_mib * 2**20)
        )
    else:
        files = [directory / "model.safetensors"]
        save_file(dict(_tensors(model_mib, tensor_mib)), str(files[0]), metadata={"format": "pt"})
    seconds = time.perf_counter() - began
    peak = _status("VmHWM") - before
    return {"peak_extra_mib": peak / 2**20, "seconds": seconds, "files": len(files),
            "bytes_mib": sum(f.stat().st_size for f in files) / 2**20}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-mib", type=float, default=512.0)
    parser.add_argument("--tensor-mib", type=float, default=16.0)
    parser.add_argument("--shard-mib", type=float, default=128.0)
    parser.add_argument("--only", choices=["streamed", "whole"], help="one kind (a test's run)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    results = {}
    for kind in [args.only] if args.only else ["streamed", "whole"]:
        with tempfile.TemporaryDirectory() as tmp:
            results[kind] = measure(kind, args.model_mib, args.tensor_mib, args.shard_mib, Path(tmp))
    print(
        f"model {args.model_mib:.0f} MiB in tensors of {args.tensor_mib:.0f} MiB, files of {args.shard_mib:.0f} MiB"
    )
    print(f"{'kind':<10}{'peak extra MiB':>16}{'files':>7}{'written MiB':>13}{'seconds':>9}")
    for kind, r in results.items():
        print(
            f"{kind:<10}{r['peak_extra_mib']:>16.1f}{r['files']:>7.0f}{r['bytes_mib']:>13.1f}{r['seconds']:>9.2f}"
        )
    if len(results) == 2:
        ratio = results["whole"]["peak_extra_mib"] / max(results["streamed"]["peak_extra_mib"], 1e-9)
        print(f"whole / streamed peak extra memory: {ratio:.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(vars(args) | {"results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

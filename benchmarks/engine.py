"""Embedded engine throughput, prefix-cache latency and constrained decoding, side by side.

    python benchmarks/engine.py [--model DIR] [--threads N] [--new-tokens 128] [--trials 5] [--compare-lanes]
                                [--sections throughput,ttft,constrained]

Prints two tables and writes ``benchmarks/results/engine.json``:
1. decode throughput (generated tokens/s) at 1, 8, 32 and 128 concurrent requests, the engine vs HF ``generate`` at
   the same batch size, same model, same threads, in the same run. Each of ``--trials`` rounds measures every batch
   size once; the table shows medians, and "engine / @1" (engine@1) is the median of each round's own ratio (this
   machine's speed drifts between rounds); "same, CPU time" is that ratio in tokens per second of the process's CPU
   time, which other processes on a busy machine do not inflate. ``--compare-lanes`` adds an engine with
   ``decode_lanes`` off;
2. time to first token of a request extending a cached 2,000-token prefix vs the same request cold;
3. constrained decoding: the decode step time at ``--constrained-batch`` (32) concurrent requests with no grammar vs
   every row under a JSON schema (xgrammar's mask), alternating in each of ``--trials`` rounds, and the ratio; with
   the time the grammar work takes per step (bitmask fill + apply, and accepting the sampled tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from gyre.config import EngineConfig
from gyre.engine.embedded.asyncengine import EmbeddedEngine
from gyre.engine.embedded.grammar import Grammars
from gyre.engine.models import init_model
from gyre.protocol import GenerateRequest, SamplingParams


def _prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(length)] for _ in range(n)]


def engine_throughput(
    engine: EmbeddedEngine, batch: int, prompt_len: int, new_tokens: int
) -> tuple[float, float]:
    """Generated tokens per second with ``batch`` concurrent requests (all arrive together): per wall-clock second
    and per second of this process's CPU time (what other processes on a busy machine cannot inflate)."""
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
    reqs = [GenerateRequest(input_ids=p, sampling_params=params) for p in _prompts(batch, prompt_len, batch)]

    async def run() -> tuple[float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        outs = await asyncio.gather(*(engine.generate(r) for r in reqs))
        elapsed, cpu_s = time.perf_counter() - start, time.process_time() - cpu
        assert all(len(o.output_ids) == new_tokens for o in outs)
        return batch * new_tokens / elapsed, batch * new_tokens / cpu_s

    return asyncio.run(run())


def hf_throughput(model: Any, batch: int, prompt_len: int, new_tokens: int) -> float:
    """The same measurement with Hugging Face ``generate`` (one static batch, sampling, KV cache)."""
    ids = torch.tensor(_prompts(batch, prompt_len, batch))
    with torch.no_grad():
        start = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=True,
            top_k=0,
            pad_token_id=0,
        )
        elapsed = time.perf_counter() - start
    assert out.shape[1] == prompt_len + new_tokens
    return batch * new_tokens / elapsed


def time_to_first_token(engine: EmbeddedEngine, prefix_len: int, repeats: int) -> tuple[float, float]:
    """Median seconds to the first token for a request extending a cached ``prefix_len`` prefix, and cold."""
    one = SamplingParams(max_new_tokens=1, temperature=0.0)

    async def ttft(ids: list[int]) -> tuple[float, int]:
        start = time.perf_counter()
        out = await engine.generate(GenerateRequest(input_ids=ids, sampling_params=one))
        return time.perf_counter() - start, out.meta_info.cached_tokens

    warm, cold = [], []
    for i in range(repeats):
        prefix = _prompts(1, prefix_len, 1000 + i)[0]
        suffix = _prompts(1, 20, 2000 + i)[0]
        asyncio.run(engine.flush_cache())
        t_cold, cached = asyncio.run(ttft(prefix + suffix))
        assert cached == 0
        cold.append(t_cold)
        asyncio.run(ttft(prefix + [1]))  # an earlier turn leaves the prefix in the cache
        t_warm, cached = asyncio.run(ttft(prefix + suffix))
        assert cached >= prefix_len
        warm.append(t_warm)
    return statistics.median(warm), statistics.median(cold)


# Every constrained row stays under the grammar for the whole run: an array of at least 50 structured items cannot end
# in the tokens measured (a random model writes ~30 tokens per item), so no row leaves the batch early.
_ITEM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer"},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "home": {
            "type": "object",
            "properties": {"x": {"type": "number"}, "indoor": {"type": "boolean"}},
            "required": ["x", "indoor"],
        },
    },
    "required": ["name", "age", "kind", "home"],
}
CONSTRAINED_SCHEMA = json.dumps({"type": "array", "items": _ITEM, "minItems": 50})


class _StepClock:
    """Times the engine thread's decode-only steps at full batch, and the grammar work inside them."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self.engine, self.sched = engine, engine.scheduler
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.grammar_s = {"mask": 0.0, "accept": 0.0}
        self.batch = 0

    def __enter__(self) -> _StepClock:
        sched, grammars = self.sched, self.engine.grammars
        step, self._accept = sched.step, Grammars.accept

        def timed_step() -> list[Any]:
            prefill, generated = sched.stats.prefill_tokens, sched.stats.generated_tokens
            start, cpu = time.perf_counter(), time.process_time()
            news = step()
            wall, cpu_s = time.perf_counter() - start, time.process_time() - cpu
            if (
                sched.stats.prefill_tokens == prefill
                and sched.stats.generated_tokens - generated == self.batch
            ):
                self.wall.append(wall)
                self.cpu.append(cpu_s)
            return news

        def timed(name: str, fn: Any) -> Any:
            def run(*args: Any) -> Any:
                start = time.perf_counter()
                try:
                    return fn(*args)
                finally:
                    self.grammar_s[name] += time.perf_counter() - start

            return run

        sched.step = timed_step  # type: ignore[method-assign]
        if grammars is not None:
            grammars.mask = timed("mask", grammars.mask)  # type: ignore[method-assign]
        Grammars.accept = staticmethod(timed("accept", self._accept))  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        del self.sched.step
        if self.engine.grammars is not None:
            del self.engine.grammars.mask
        Grammars.accept = staticmethod(self._accept)  # type: ignore[method-assign]


def constrained_step_times(
    engine: EmbeddedEngine, batch: int, prompt_len: int, new_tokens: int, schema: str | None
) -> dict[str, float]:
    """Median decode step (wall and process CPU seconds) with ``batch`` requests decoding together, every row under
    ``schema`` (None: no grammar), and the grammar's seconds per step."""
    params = SamplingParams(
        max_new_tokens=new_tokens, temperature=1.0, ignore_eos=schema is None, json_schema=schema
    )
    reqs = [
        GenerateRequest(input_ids=p, sampling_params=params) for p in _prompts(batch, prompt_len, 7 + batch)
    ]

    async def run() -> None:
        outs = await asyncio.gather(*(engine.generate(r) for r in reqs))
        assert all(o.meta_info.finish_reason == {"type": "length", "length": new_tokens} for o in outs)

    with _StepClock(engine) as clock:
        clock.batch = batch
        asyncio.run(run())
    steps = len(clock.wall)
    assert steps >= new_tokens // 2, f"only {steps} full-batch decode steps were measured"
    return {
        "step_s": statistics.median(clock.wall),
        "step_cpu_s": statistics.median(clock.cpu),
        "steps": steps,
        "mask_s_per_step": clock.grammar_s["mask"] / steps,
        "accept_s_per_step": clock.grammar_s["accept"] / steps,
    }


def constrained_comparison(
    engine: EmbeddedEngine, batch: int, prompt_len: int, new_tokens: int, trials: int, console: Console
) -> dict[str, Any]:
    """Decode step time without a grammar vs every row under `CONSTRAINED_SCHEMA`, alternating in each round."""
    constrained_step_times(
        engine, 4, prompt_len, 8, CONSTRAINED_SCHEMA
    )  # imports xgrammar, compiles the schema
    rounds: dict[str, list[dict[str, float]]] = {"none": [], "json_schema": []}
    for trial in range(trials):
        for name, schema in (("none", None), ("json_schema", CONSTRAINED_SCHEMA)):
            rounds[name].append(constrained_step_times(engine, batch, prompt_len, new_tokens, schema))
        none, constrained = rounds["none"][-1]["step_s"], rounds["json_schema"][-1]["step_s"]
        console.print(f"trial {trial + 1}: decode step at {batch}: {none * 1e3:.2f} ms free, "
                      f"{constrained * 1e3:.2f} ms under a JSON schema ({constrained / none:.3f}x)")  # fmt: skip

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds[name])

    ratios = [c["step_s"] / n["step_s"] for n, c in zip(rounds["none"], rounds["json_schema"], strict=True)]
    cpu_ratios = [
        c["step_cpu_s"] / n["step_cpu_s"] for n, c in zip(rounds["none"], rounds["json_schema"], strict=True)
    ]
    result = {
        "batch": batch,
        "new_tokens": new_tokens,
        "free_step_s": median("none", "step_s"),
        "constrained_step_s": median("json_schema", "step_s"),
        "ratio": statistics.median(ratios),
        "cpu_ratio": statistics.median(cpu_ratios),
        "mask_s_per_step": median("json_schema", "mask_s_per_step"),
        "accept_s_per_step": median("json_schema", "accept_s_per_step"),
        "rounds": rounds,
    }
    result["grammar_share"] = (result["mask_s_per_step"] + result["accept_s_per_step"]) / result[
        "free_step_s"
    ]
    table = Table(
        title=f"Decode step at {batch} concurrent requests, free vs JSON schema, median of {trials}"
    )
    cols = (
        "free",
        "JSON schema",
        "schema / free",
        "same, CPU time",
        "mask (fill + apply)",
        "accept",
        "grammar / free",
    )
    for col in cols:
        table.add_column(col, justify="right")
    table.add_row(
        f"{result['free_step_s'] * 1e3:.2f} ms",
        f"{result['constrained_step_s'] * 1e3:.2f} ms",
        f"{result['ratio']:.3f}x",
        f"{result['cpu_ratio']:.3f}x",
        f"{result['mask_s_per_step'] * 1e3:.3f} ms",
        f"{result['accept_s_per_step'] * 1e3:.3f} ms",
        f"{result['grammar_share']:.1%}",
    )
    console.print(table)
    return result


def throughput_section(
    args: argparse.Namespace, engines: dict[str, EmbeddedEngine], model_dir: Path, console: Console
) -> list[dict[str, Any]]:
    """Table 1: decode throughput per batch size, the engine(s) vs Hugging Face ``generate``, in rounds."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
    batches = [int(b) for b in args.batches.split(",")]
    for eng in engines.values():
        engine_throughput(eng, 4, args.prompt_len, 8)  # warm-up
    runs: dict[str, dict[int, list[float]]] = {name: {b: [] for b in batches} for name in [*engines, "hf"]}
    cpu: dict[str, dict[int, list[float]]] = {name: {b: [] for b in batches} for name in engines}
    for trial in range(
        args.trials
    ):  # rounds over every batch size: each round's ratios share its machine speed
        for batch in batches:
            for name, eng in engines.items():
                wall, per_cpu_s = engine_throughput(eng, batch, args.prompt_len, args.new_tokens)
                runs[name][batch].append(wall)
                cpu[name][batch].append(per_cpu_s)
            runs["hf"][batch].append(hf_throughput(hf, batch, args.prompt_len, args.new_tokens))
            line = ", ".join(f"{name} {runs[name][batch][-1]:,.0f}" for name in runs)
            console.print(f"trial {trial + 1}, batch {batch}: {line} tok/s")
    base = batches[0]

    def scaling(name: str, batch: int, of: dict[str, dict[int, list[float]]] = runs) -> float:
        """Median over rounds of throughput at ``batch`` over throughput at the first batch size, same round."""
        return statistics.median(a / b for a, b in zip(of[name][batch], of[name][base], strict=True))

    rows = []
    for batch in batches:
        row: dict[str, Any] = {
            "concurrent": batch,
            "engine_tok_s": statistics.median(runs["engine"][batch]),
            "hf_generate_tok_s": statistics.median(runs["hf"][batch]),
            "engine_scaling": scaling("engine", batch),
            "engine_cpu_scaling": scaling("engine", batch, cpu),
            "trials": {name: runs[name][batch] for name in runs},
            "trials_per_cpu_s": {name: cpu[name][batch] for name in cpu},
        }
        if args.compare_lanes:
            row["no_lanes_tok_s"] = statistics.median(runs["no lanes"][batch])
            row["no_lanes_scaling"] = scaling("no lanes", batch)
            row["no_lanes_cpu_scaling"] = scaling("no lanes", batch, cpu)
        rows.append(row)
    table = Table(
        title=f"Decode throughput, {args.prompt_len}-token prompts, {args.new_tokens} new tokens, "
        f"{args.threads} thread(s), median of {args.trials}"
    )
    cols = ["concurrent", "engine tok/s", "HF tok/s", "engine / HF", f"engine / @{base}", "same, CPU time"]
    if args.compare_lanes:
        cols += ["no lanes tok/s", f"no lanes / @{base}", "same, CPU time"]
    for col in cols:
        table.add_column(col, justify="right")
    for r in rows:
        cells = [
            str(r["concurrent"]),
            f"{r['engine_tok_s']:,.0f}",
            f"{r['hf_generate_tok_s']:,.0f}",
            f"{r['engine_tok_s'] / r['hf_generate_tok_s']:.2f}x",
            f"{r['engine_scaling']:.1f}x",
            f"{r['engine_cpu_scaling']:.1f}x",
        ]
        if args.compare_lanes:
            cells += [
                f"{r['no_lanes_tok_s']:,.0f}",
                f"{r['no_lanes_scaling']:.1f}x",
                f"{r['no_lanes_cpu_scaling']:.1f}x",
            ]
        table.add_row(*cells)
    console.print(table)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="model directory (default: a fresh tiny model)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, the same for both")
    parser.add_argument("--batches", default="1,8,32,128")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prefix-len", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5, help="time-to-first-token samples (median)")
    parser.add_argument("--trials", type=int, default=3, help="throughput rounds (median)")
    parser.add_argument(
        "--compare-lanes", action="store_true", help="also run an engine with decode_lanes off"
    )
    parser.add_argument("--constrained-batch", type=int, default=32)
    parser.add_argument("--constrained-tokens", type=int, default=64, help="tokens per request, section 3")
    parser.add_argument("--sections", default="throughput,ttft,constrained", help="which tables to measure")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "engine.json")
    args = parser.parse_args()
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    sections = set(args.sections.split(","))
    if not sections <= {"throughput", "ttft", "constrained"}:
        parser.error("--sections takes throughput, ttft and constrained, comma-separated")
    console = Console()
    torch.set_num_threads(args.threads)
    model_dir = args.model or init_model(Path(tempfile.mkdtemp()) / "tiny")
    engines = {"engine": EmbeddedEngine(EngineConfig(model_path=str(model_dir), num_threads=args.threads))}
    if args.compare_lanes:
        engines["no lanes"] = EmbeddedEngine(
            EngineConfig(model_path=str(model_dir), num_threads=args.threads, decode_lanes=False)
        )
    engine = engines["engine"]
    result: dict[str, Any] = {"threads": args.threads, "trials": args.trials}
    if "throughput" in sections:
        result["throughput"] = throughput_section(args, engines, model_dir, console)
    if "ttft" in sections:
        warm, cold = time_to_first_token(engine, args.prefix_len, args.repeats)
        ttft = Table(
            title=f"Time to first token, request extending a {args.prefix_len}-token prefix (median)"
        )
        for col in ("cached prefix", "cold", "speed-up"):
            ttft.add_column(col, justify="right")
        ttft.add_row(f"{warm * 1e3:.1f} ms", f"{cold * 1e3:.1f} ms", f"{cold / warm:.1f}x")
        console.print(ttft)
        result["ttft"] = {
            "prefix_len": args.prefix_len,
            "cached_s": warm,
            "cold_s": cold,
            "speedup": cold / warm,
        }
    if "constrained" in sections:
        result["constrained"] = constrained_comparison(
            engine, args.constrained_batch, args.prompt_len, args.constrained_tokens, args.trials, console
        )
    for eng in engines.values():
        eng.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""xLong (issue 47): one execution of 700,000 tokens, stage by stage.

Parts, run with ``--parts a,b,c,d,e`` (default: all):
  (a) a synthetic execution of ``calls`` x (``new_in`` + ``out``) tokens through records -> journal -> tree ->
      micro-steps: wall time and peak Python memory (tracemalloc) per stage; target < 1 GB and < 30 s in all.
  (d) the router's per-call work with 7K / 70K / 700K tokens of history (TITO: match the previous call, render and
      tokenize only the new messages, append to the previous ids), side by side; target 700K <= 2x 7K.
  (b) one training step of (a)'s execution (``--tokens``, default 700K: 15-30 min of both cores) with the ``micro``
      preset on 4 gloo ranks (CP=4) and on one (CP=1) where `gyre.train.budget` predicts it fits in this machine's
      free memory, else on one at ``--fit-tokens`` and fitted (memory = a + b n); time and per-rank peak memory per
      stage, measured beside predicted; target CP=4 / CP=1 per-rank peak <= 0.3.
  (c) the tiny model on one chain of 8K, 16K, 32K and 64K tokens (calls of 600 in + 100 sampled) with CP=1, 2, 4
      (``--c-sizes``, ``--c-cps``): forward+backward time and per-rank peak memory, least-squares fits time = a +
      b n + c n^2 and memory = a + b n (with a quadratic fit's n^2 share as the check that it is linear), and their
      projection to 700K; at the largest size, CP=1 and the most ranks again with 4 query heads a key/value head:
      the CP ratio (target <= 0.35 at CP=4) and the K/V memory one head fewer saves, measured beside the budget.
  (e) Qwen3-8B at 700K tokens on a cell of 8 x 80 GB (CP=8) from `gyre.train.budget`: memory per rank by term and
      step time at an assumed H100 throughput, with and without activation checkpointing, optimizer state sharded
      (ZeRO-1) or everything sharded (FSDP); then Qwen3-8B and 32B from 128K to 700K tokens. The budget's
      activation and K/V terms are the tensors the tiny model keeps (tests/unit/train/test_memory.py) and (c) sets
      its per-rank peaks beside them.
Each part is a function that returns a dict of figures and prints its table. Ranks are fresh processes
(``benchmarks/xlong_ranks.py``: how peak memory is measured). ``--quick`` runs each part in seconds (the slow test
tier).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
MB = 2**20


def _measure(fn: Callable[[], T]) -> tuple[T, float, float]:
    """``fn()``, its wall seconds and its peak traced memory in MB."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        out = fn()
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    return out, seconds, peak


def synthetic_records(calls: int, new_in: int, out: int, session: str = "s0") -> list[Any]:
    """One execution of ``calls`` chained calls, each adding ``new_in`` input and ``out`` sampled tokens."""
    from gyre.journal.records import CallRecord, CallTiming

    records: list[CallRecord] = []
    prefix = 0
    for i in range(calls):
        base = (i * 7919) % 150_000
        new_ids = [(base + k) % 151_000 for k in range(new_in)]
        out_ids = [(base + 3 * k + 1) % 151_000 for k in range(out)]
        records.append(
            CallRecord(
                call_id=f"{session}-{i}",
                session=session,
                role="main",
                parent_call_id=records[-1].call_id if records else None,
                prefix_len=prefix,
                new_input_ids=new_ids,
                output_ids=out_ids,
                output_logprobs=[-0.5] * out,
                finish_reason="stop",
                weight_version=0,
                cell="c0",
                timing=CallTiming(submitted_s=0.0, first_token_s=0.0, finished_s=0.0),
            )
        )
        prefix += new_in + out
    return records


def part_a(quick: bool) -> dict[str, Any]:
    """Records -> journal -> tree -> micro-steps of one long execution."""
    from gyre.journal import Journal, read_journal
    from gyre.journal.records import CallRecord
    from gyre.train.prefixtree import TrajectoryTree
    from gyre.train.step import Rollout, build_step

    calls, new_in, out = (100, 600, 100) if quick else (1000, 600, 100)
    rows: list[tuple[str, float, float]] = []
    records, s, mb = _measure(lambda: synthetic_records(calls, new_in, out))
    rows.append(("records", s, mb))
    with tempfile.TemporaryDirectory() as tmp:

        def write() -> Path:
            journal = Journal(tmp)
            for r in records:
                journal.append(r)
            journal.close()
            return Path(tmp) / "calls.jsonl"

        path, s, mb = _measure(write)
        rows.append(("journal write", s, mb))
        read, s, mb = _measure(lambda: list(read_journal(path, CallRecord)))
        rows.append(("journal read", s, mb))
    assert read == records
    tree, s, mb = _measure(lambda: TrajectoryTree(read))
    rows.append(("tree", s, mb))
    rollouts = [Rollout(execution_id="e0", group="g", reward=1.0, records=read),
                Rollout(execution_id="e1", group="g", reward=0.0, records=read)]  # fmt: skip
    budget = calls * (new_in + out) + 1
    step, s, mb = _measure(lambda: build_step(rollouts, jmax=None, token_budget=budget, normalization="mean"))
    rows.append(("micro-steps (2 executions)", s, mb))
    tokens = calls * (new_in + out)
    print(f"\n(a) one execution of {calls} calls x {new_in + out} new tokens = {tokens:,} tokens")
    print(f"{'stage':<28}{'seconds':>10}{'peak MB':>10}")
    for name, s, mb in rows:
        print(f"{name:<28}{s:>10.3f}{mb:>10.1f}")
    total_s = sum(r[1] for r in rows)
    peak = max(r[2] for r in rows)
    print(f"{'all':<28}{total_s:>10.3f}{peak:>10.1f}   target < 30 s, < 1024 MB")
    return {"tokens": tokens, "tree_nodes": len(tree.nodes()), "micro_steps": len(step.micro_steps),
            "stages": [{"stage": n, "seconds": s, "peak_mb": m} for n, s, m in rows],
            "total_s": total_s, "peak_mb": peak}  # fmt: skip


def part_d(quick: bool, model_dir: Path | None = None) -> dict[str, Any]:
    """The router's per-call TITO work with a long history, through the router's own per-call functions.

    One session is driven call by call (``Router._start_chat`` then ``Router._finish_chat``, the engine replaced by
    a canned reply) until its history reaches each size; then ``reps`` more calls are timed, each request decoded
    from JSON bytes as the HTTP server decodes it (fresh message objects, as a scaffold sends them). Printed beside
    the router's figure, the two O(history) costs outside it: decoding the request body (the OpenAI API resends
    the whole conversation) and encoding the engine request (the SGLang API takes every input id)."""
    return asyncio.run(_part_d(quick, model_dir))


async def _part_d(quick: bool, model_dir: Path | None) -> dict[str, Any]:
    import msgspec

    from gyre.config import RouterConfig
    from gyre.engine.models import init_model
    from gyre.protocol import GenerateRequest
    from gyre.router.openai_types import ChatRequest
    from gyre.router.pool import Generation
    from gyre.router.render import ChatRenderer
    from gyre.router.routing import Router

    histories = (7_000, 70_000) if quick else (7_000, 70_000, 700_000)
    reps = 5 if quick else 10
    words = " ".join(f"w{k}" for k in range(300))  # a long observation: ~600 tokens
    rows: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        directory = model_dir or init_model(Path(tmp) / "tiny", preset="tiny", seed=0)
        renderer = ChatRenderer.from_model_dir(directory)
        out_ids = renderer.encode("ok " * 50) + [renderer.eos_token_id]  # the canned reply: ~100 tokens
        # no engine (a canned reply instead) and the context length unknown: no call is refused
        router = Router(RouterConfig(), renderer=renderer)
        try:
            token = router.open_session("xlong-d")
            session = router.session(token)
            messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
            history = 0  # input + output ids of the newest call

            async def call(req: ChatRequest) -> tuple[int, float, Any]:
                t0 = time.perf_counter()
                chat = await router._start_chat(session, req)
                gen = Generation(list(out_ids), [-0.5] * len(out_ids), [], {"type": "stop",
                                 "matched": renderer.eos_token_id}, 0, "e", ["e"], None,
                                 [0] * len(out_ids), "policy")  # fmt: skip
                body = router._finish_chat(session, req, "main", chat, gen)
                seconds = time.perf_counter() - t0
                messages.append(body["choices"][0]["message"])
                return body["usage"]["total_tokens"], seconds, chat

            for target in histories:
                while history < target:  # in-process agent: its own message objects, no JSON
                    messages.append({"role": "user", "content": f"{len(messages)} {words}"})
                    history, _, _ = await call(ChatRequest(model="", messages=list(messages)))
                start = history
                router_s, decode_s, encode_s = [], [], []
                for _ in range(reps):
                    messages.append({"role": "user", "content": f"{len(messages)} {words}"})
                    raw = msgspec.json.encode({"model": "", "messages": messages})
                    t0 = time.perf_counter()
                    req = msgspec.json.decode(raw, type=ChatRequest)
                    decode_s.append(time.perf_counter() - t0)
                    history, seconds, chat = await call(req)
                    router_s.append(seconds)
                    assert chat.parent is not None, "the call did not extend the previous one"
                    t0 = time.perf_counter()
                    msgspec.json.encode(
                        GenerateRequest(input_ids=chat.input_ids, sampling_params=chat.params)
                    )
                    encode_s.append(time.perf_counter() - t0)
                rows[target] = {"history_tokens": start, "router_ms": statistics.median(router_s) * 1000,
                                "body_decode_ms": statistics.median(decode_s) * 1000,
                                "engine_encode_ms": statistics.median(encode_s) * 1000}  # fmt: skip
        finally:
            await router.aclose()
    base = rows[histories[0]]["router_ms"]
    print(f"\n(d) router render + tokenize per call (TITO), median of {reps} chained calls each, ms")
    print(f"{'history':>10}{'router':>10}{'x 7K':>8}{'body decode':>14}{'engine encode':>15}")
    for h in histories:
        r = rows[h]
        print(f"{r['history_tokens']:>10,}{r['router_ms']:>10.3f}{r['router_ms'] / base:>8.2f}"
              f"{r['body_decode_ms']:>14.3f}{r['engine_encode_ms']:>15.3f}")  # fmt: skip
    print("  target: router at 700K <= 2x 7K; body decode and engine encode are O(history) by the APIs")
    return {"per_call_ms": {str(h): r["router_ms"] for h, r in rows.items()},
            "rows": {str(h): r for h, r in rows.items()},
            "ratio_last": rows[histories[-1]]["router_ms"] / base}  # fmt: skip


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def _stage_rows(ranks: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Per stage, the slowest rank's seconds and the largest per-rank peak (MB above baseline)."""
    rows: dict[str, tuple[float, float]] = {}
    for rank in ranks:
        for st in rank["stages"]:
            s, mb = rows.get(st["stage"], (0.0, 0.0))
            rows[st["stage"]] = (max(s, st["seconds"]), max(mb, st["peak_mb"]))
    return rows


def _fit(ns: list[int], ys: list[float], at: int, degree: int = 2) -> dict[str, Any]:
    """Least squares ``y = a + b n + c n^2`` (``degree`` 1: ``a + b n``; fewer terms with fewer points) and its
    value at ``at``."""
    import numpy as np

    terms = min(degree + 1, len(ns))
    x = np.array([[float(n) ** k for k in range(terms)] for n in ns])
    coef = np.linalg.lstsq(x, np.array(ys, dtype=float), rcond=None)[0].tolist()
    coef += [0.0] * (3 - terms)
    return {"a": coef[0], "b": coef[1], "c": coef[2], "terms": terms,
            "projected": coef[0] + coef[1] * at + coef[2] * at * at}  # fmt: skip


def _config(directory: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((directory / "config.json").read_text())
    return config


def _budget(config: dict[str, Any], tokens: int, cp: int) -> Any:
    """`gyre.train.budget` of a chain laid out as (a)'s calls (of every 700 tokens the last 100 are sampled and
    scored), held as these ranks hold state: fp32, a local gradient and AdamW's moments, no step sum."""
    from gyre.train.budget import FP32_LOCAL, step_budget

    scored = sum(1 for i in range(1, tokens) if i % 700 >= 600)
    return step_budget(config, tokens, cp=cp, precision=FP32_LOCAL, scored_tokens=scored)


def _predicted_mb(config: dict[str, Any], tokens: int, cp: int) -> dict[str, float]:
    """The budget's bytes a rank adds to its loaded model by the end of each stage (MB)."""
    m = _budget(config, tokens, cp).memory
    compute = m["gradients"] + m["activations"] + m["keys_values"] + m["logits"]
    return {
        "forward+backward": compute / MB,
        "optimizer": max(compute, m["gradients"] * 2 + m["moments"]) / MB,
    }


def part_b(
    quick: bool,
    tokens: int = 700_000,
    fit_tokens: tuple[int, ...] = (65_536, 131_072, 262_144),
    force_fit: bool = False,
) -> dict[str, Any]:
    """One training step of (a)'s execution with the micro preset at CP=4 and CP=1 (``force_fit``: CP=1 fitted at
    ``fit_tokens`` even where it would fit at ``tokens``)."""
    import os

    from rich.progress import Progress

    from gyre.engine.models import init_model
    from gyre.train.step import Rollout, build_step
    from xlong_ranks import run_group

    new_in, out = 600, 100
    tokens = 1_400 if quick else tokens

    def execution(n: int) -> Any:  # (a)'s records -> tree -> micro-steps; the first execution's micro-step
        calls = max(1, n // (new_in + out))
        records = synthetic_records(calls, new_in, out)
        rollouts = [Rollout(execution_id="e0", group="g", reward=1.0, records=records),
                    Rollout(execution_id="e1", group="g", reward=0.0, records=records)]  # fmt: skip
        step = build_step(rollouts, jmax=None, token_budget=calls * (new_in + out) + 1, normalization="mean")
        micro = step.micro_steps[0]
        assert len(micro.input_ids) == calls * (new_in + out), "one execution, one micro-step"
        return micro

    free_mb = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / MB
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, Progress(console=_console(), transient=True) as progress:
        directory = init_model(Path(tmp) / "micro", preset="micro", seed=0)
        config = _config(directory)
        micro = execution(tokens)
        n = len(micro.input_ids)
        one = _predicted_mb(config, n, 1)["optimizer"]
        fitted = [k for k in fit_tokens if k < n]
        cp1 = fitted if (force_fit or one > 0.7 * free_mb) and fitted else [n]  # measured where it fits
        plan = [(4, n), *[(1, k) for k in cp1]]
        task = progress.add_task("(b) micro preset", total=len(plan))
        for cp, k in plan:
            progress.update(task, description=f"(b) micro preset: {k:,} tokens on {cp} rank(s)")
            step_micro = micro if k == n else execution(k)
            ranks = run_group(directory, step_micro, cp, optimizer=True)
            runs[f"cp{cp}-{len(step_micro.input_ids)}"] = {"cp": cp, "tokens": len(step_micro.input_ids),
                                                        "ranks": ranks}  # fmt: skip
            progress.advance(task)
    print(f"\n(b) one training step of (a)'s execution: {n:,} tokens, micro preset (1 layer, 1 head x 16, vocab "
          f"{config['vocab_size']:,}), one thread a rank; peak = ru_maxrss above the rank's loaded baseline")  # fmt: skip
    print(f"{'run':<16}{'stage':<18}{'s (slowest)':>12}{'peak MB':>10}{'predicted MB':>14}{'GFLOP/s':>9}")
    figures: dict[str, Any] = {"tokens": n, "runs": {}}
    for name, run in runs.items():
        rows = _stage_rows(run["ranks"])
        predicted = _predicted_mb(config, run["tokens"], run["cp"])
        flops = _budget(config, run["tokens"], run["cp"]).flops_per_rank
        for stage, (s, mb) in rows.items():
            rate = f"{flops / s / 1e9:9.2f}" if stage == "forward+backward" else ""
            want = f"{predicted[stage]:14.1f}" if stage in predicted else ""
            print(f"{name:<16}{stage:<18}{s:>12.2f}{mb:>10.1f}{want:>14}{rate}")
        figures["runs"][name] = {
            "cp": run["cp"],
            "tokens": run["tokens"],
            "loss": sum(r["loss"] for r in run["ranks"]),  # each rank's part: their sum is the micro-step's
            "stages": {k: {"seconds": s, "peak_mb": mb} for k, (s, mb) in rows.items()},
            "predicted_mb": predicted,
            "flops_per_rank": flops,
        }
    four = max(st["peak_mb"] for st in figures["runs"][f"cp4-{n}"]["stages"].values())
    ones = {r["tokens"]: max(st["peak_mb"] for st in r["stages"].values())
            for r in figures["runs"].values() if r["cp"] == 1}  # fmt: skip
    if n in ones:
        one_mb, how = ones[n], "measured"
    else:
        fit = _fit(sorted(ones), [ones[k] for k in sorted(ones)], n, degree=1)
        sizes = ", ".join(f"{k:,}" for k in sorted(ones))
        one_mb, how = fit["projected"], f"fitted a + b n at {sizes}"
        figures["cp1_fit"] = fit
    ratio = four / one_mb
    print(f"per-rank peak CP=4 / CP=1: {four:.1f} / {one_mb:.1f} MB ({how}) = {ratio:.2f}x   target <= 0.3x")
    figures |= {"cp4_peak_mb": four, "cp1_peak_mb": one_mb, "cp1_how": how, "ratio": ratio}
    return figures


def grouped_model(directory: Path, kv_heads: int, seed: int = 0) -> Path:
    """The tiny preset's shape with ``kv_heads`` key/value heads for its 4 query heads, randomly initialised."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from gyre.engine.models import init_model

    init_model(directory, preset="tiny", seed=seed)
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    config.num_key_value_heads = kv_heads
    import torch

    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


def part_c(
    quick: bool, sizes: tuple[int, ...] = (8_192, 16_384, 32_768, 65_536), cps: tuple[int, ...] = (1, 2, 4)
) -> dict[str, Any]:
    """The tiny model at growing chain lengths and CP sizes: time and per-rank memory, fitted and projected; at the
    largest size the same with 4 query heads a key/value head, and the K/V memory the grouped heads save."""
    from rich.progress import Progress

    from gyre.engine.models import init_model
    from xlong_ranks import chain_micro_step, run_group

    if quick:
        sizes, cps = (1_024, 2_048), (1, 2)
    target, largest, most = 700_000, max(sizes), max(cps)
    ends = tuple(sorted({1, most}))  # the grouped model: CP=1 and the most ranks, at the largest size
    measured: dict[int, dict[int, tuple[float, float]]] = {cp: {} for cp in cps}
    grouped: dict[int, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, Progress(console=_console(), transient=True) as progress:
        directory = init_model(Path(tmp) / "tiny", preset="tiny", seed=0)
        four = grouped_model(Path(tmp) / "tiny-gqa4", kv_heads=1)
        config, config4 = _config(directory), _config(four)
        task = progress.add_task("(c) tiny", total=len(sizes) * len(cps) + len(ends))
        for n in sizes:
            micro = chain_micro_step(n, config["vocab_size"])
            for cp in cps:
                progress.update(task, description=f"(c) tiny: {n:,} tokens on {cp} rank(s)")
                measured[cp][n] = _stage_rows(run_group(directory, micro, cp, optimizer=False))[
                    "forward+backward"
                ]
                progress.advance(task)
        micro = chain_micro_step(largest, config4["vocab_size"])
        for cp in ends:
            progress.update(
                task, description=f"(c) tiny, 4 heads a k/v head: {largest:,} tokens on {cp} rank(s)"
            )
            grouped[cp] = _stage_rows(run_group(four, micro, cp, optimizer=False))["forward+backward"]
            progress.advance(task)
    print("\n(c) tiny model (4 layers, 4 heads x 48, 2 k/v heads), one chain (calls of 600 in + 100 sampled), "
          "forward+backward; slowest rank's s, largest rank's peak MB (ru_maxrss above its loaded baseline), one "
          "thread a rank; ring attention")  # fmt: skip
    print(f"{'tokens':>8}" + "".join(f"{f'CP={cp} s':>11}{'MB':>9}{'pred MB':>9}" for cp in cps))
    for n in sizes:
        cells = ""
        for cp in cps:
            s, mb = measured[cp][n]
            cells += f"{s:>11.2f}{mb:>9.1f}{_predicted_mb(config, n, cp)['forward+backward']:>9.1f}"
        print(f"{n:>8,}{cells}")
    print(f"fits (n in tokens) and projections to {target:,} tokens")
    figures: dict[str, Any] = {"sizes": list(sizes), "measured": {}, "fits": {}}
    for cp in cps:
        ns = sorted(measured[cp])
        time_fit = _fit(ns, [measured[cp][n][0] for n in ns], target)
        # memory is projected from a line; a quadratic fit's n^2 term at the largest size says how linear it is
        mem_fit = _fit(ns, [measured[cp][n][1] for n in ns], target, degree=1)
        curve = _fit(ns, [measured[cp][n][1] for n in ns], target)
        mem_fit["quadratic_share"] = curve["c"] * ns[-1] ** 2 / measured[cp][ns[-1]][1]
        budget = _budget(config, target, cp)
        print(
            f"  CP={cp} time   s = {time_fit['a']:.3g} + {time_fit['b']:.3g} n + {time_fit['c']:.3g} n^2"
            f"  -> {time_fit['projected'] / 60:,.1f} min  (budget: {budget.flops_per_rank / 1e12:,.0f} TFLOP a rank)"
        )
        print(f"  CP={cp} memory MB = {mem_fit['a']:.3g} + {mem_fit['b']:.3g} n (a quadratic fit's n^2 term at "
              f"{ns[-1]:,}: {mem_fit['quadratic_share']:+.0%} of it)"
              f"  -> {mem_fit['projected'] / 1024:,.1f} GB  (predicted {_predicted_mb(config, target, cp)['forward+backward'] / 1024:,.1f} GB)")  # fmt: skip
        figures["measured"][str(cp)] = {
            str(n): {"seconds": s, "peak_mb": mb} for n, (s, mb) in measured[cp].items()
        }
        figures["fits"][str(cp)] = {"time_s": time_fit, "memory_mb": mem_fit}
    if len(sizes) < 3:
        print("  (fewer than 3 sizes: the fits have fewer terms; the full run fits all three)")
    figures |= _grouped_rows(config, config4, largest, ends, measured, grouped)
    return figures


def _kv_mb(config: dict[str, Any], tokens: int, cp: int) -> float:
    """The budget's K/V bytes on a rank (MB): the keys and values it keeps (before and after norm and rope, every
    layer, its share of the tokens) and ring attention's blocks in flight."""
    from gyre.train.memory import ModelShape

    shape = ModelShape.from_config(config)
    kept = 2 * 2 * shape.kv_size * -(-tokens // cp) * shape.num_layers * 4
    return (kept + _budget(config, tokens, cp).memory["keys_values"]) / MB


def _grouped_rows(
    config: dict[str, Any],
    config4: dict[str, Any],
    n: int,
    ends: tuple[int, ...],
    measured: dict[int, dict[int, tuple[float, float]]],
    grouped: dict[int, tuple[float, float]],
) -> dict[str, Any]:
    """(c)'s last table: per-rank peak at CP=1 and the most ranks, 2 and 4 query heads a k/v head, side by side."""
    most = ends[-1]
    print(f"\n(c) per-rank peak at {n:,} tokens, measured (MB above the loaded baseline); K/V: the budget's k/v bytes "
          f"a rank holds (kept for backward + ring blocks in flight); target CP={most} / CP=1 <= 0.35")  # fmt: skip
    print(f"{'model':<26}" + "".join(f"{f'CP={cp} MB':>11}{'K/V MB':>9}" for cp in ends) + f"{'ratio':>8}")
    rows = {}
    for name, cfg, peaks in (("tiny (2 q heads a k/v)", config, {cp: measured[cp][n][1] for cp in ends}),
                             ("tiny, 4 q heads a k/v", config4, {cp: grouped[cp][1] for cp in ends})):  # fmt: skip
        ratio = peaks[most] / peaks[1]
        print(f"{name:<26}" + "".join(f"{peaks[cp]:>11.1f}{_kv_mb(cfg, n, cp):>9.1f}" for cp in ends)
              + f"{ratio:>8.2f}")  # fmt: skip
        rows[name] = {"peak_mb": {str(cp): peaks[cp] for cp in ends}, "ratio": ratio,
                      "kv_mb": {str(cp): _kv_mb(cfg, n, cp) for cp in ends}}  # fmt: skip
    saved = {cp: measured[cp][n][1] - grouped[cp][1] for cp in ends}
    predicted = {cp: _kv_mb(config, n, cp) - _kv_mb(config4, n, cp) for cp in ends}
    print("one k/v head fewer (2 -> 1 for 4 q heads), measured peak difference vs the budget's: "
          + ", ".join(f"CP={cp} {saved[cp]:.1f} vs {predicted[cp]:.1f} MB" for cp in ends))  # fmt: skip
    return {"grouped": {"tokens": n, "rows": rows, "kv_head_saved_mb": {str(cp): saved[cp] for cp in ends},
                        "kv_head_predicted_mb": {str(cp): predicted[cp] for cp in ends}},
            "ratio": rows["tiny (2 q heads a k/v)"]["ratio"]}  # fmt: skip


QWEN3_8B = {"model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
            "tie_word_embeddings": False}  # fmt: skip
H100_DENSE_FLOPS = 400e12  # assumed bf16 matmul throughput a GPU (of 989 TFLOP/s peak dense)
H100_ATTENTION_FLOPS = 200e12  # assumed attention-kernel throughput: ~50% of the dense figure


def part_e(quick: bool) -> dict[str, Any]:
    """Qwen3-8B, one 700K-token execution on a cell of 8 x 80 GB with CP=8, from the accounting code."""
    from gyre.train.budget import step_budget
    from gyre.train.memory import BF16, GIB

    tokens, cp = 700_000, 8
    scored = 100_000  # (a)'s execution: 1,000 calls x 100 sampled tokens carry the loss
    print(f"\n(e) Qwen3-8B, one {tokens:,}-token execution ({scored:,} scored), cell of 8 x 80 GB, CP={cp}, bf16 "
          f"(fp32 master, moments, step sum); fits: <= 90% of 80 GiB; time at {H100_DENSE_FLOPS / 1e12:.0f} "
          f"TFLOP/s dense, {H100_ATTENTION_FLOPS / 1e12:.0f} TFLOP/s attention a GPU (assumed)")  # fmt: skip
    names = ("weights", "gradients", "master", "moments", "activations", "keys_values", "logits")
    print(f"{'sharding':<10}{'ckpt':<6}" + "".join(f"{n[:11]:>12}" for n in names) + f"{'GiB/rank':>10}{'fits':>6}"
          f"{'PFLOP':>8}{'attn %':>8}{'step s':>8}")  # fmt: skip
    rows = []
    for full_shard in (False, True):
        for checkpointing in (True, False):
            b = step_budget(QWEN3_8B, tokens, cp=cp, precision=BF16, checkpointing=checkpointing,
                            scored_tokens=scored, optimizer_shards=cp, full_shard=full_shard)  # fmt: skip
            seconds = b.seconds(H100_DENSE_FLOPS, H100_ATTENTION_FLOPS)
            sharding = "FSDP" if full_shard else "ZeRO-1"
            print(f"{sharding:<10}{'on' if checkpointing else 'off':<6}"
                  + "".join(f"{b.memory[n] / GIB:>12.1f}" for n in names)
                  + f"{b.memory_bytes / GIB:>10.1f}{'yes' if b.fits() else 'no':>6}{b.flops / 1e15:>8.0f}"
                  f"{100 * b.attention_flops / b.flops:>8.0f}{seconds:>8.0f}")  # fmt: skip
            rows.append({"sharding": sharding, "checkpointing": checkpointing, "memory": b.memory,
                         "gib_per_rank": b.memory_bytes / GIB, "fits": b.fits(), "flops": b.flops,
                         "attention_flops": b.attention_flops, "step_s": seconds})  # fmt: skip
    without = None
    for c in (16, 32, 64, 128):  # more ranks, fewer tokens each: activations and ring blocks shrink
        b = step_budget(QWEN3_8B, tokens, cp=c, precision=BF16, scored_tokens=scored, optimizer_shards=c,
                        full_shard=True)  # fmt: skip
        if b.fits():
            without = c
            break
    if without:
        print(f"without checkpointing, FSDP + CP fits from CP={without}")
    else:
        print(f"without checkpointing it fits at no CP up to 128: every layer's activations of a rank's share "
              f"({b.memory['activations'] / GIB:.0f} GiB at CP=128)")  # fmt: skip
    return {"rows": rows, "cp_without_checkpointing": without, "projections": _projections(scored / tokens),
            "assumed_flops": {"dense": H100_DENSE_FLOPS, "attention": H100_ATTENTION_FLOPS}}  # fmt: skip


QWEN3_32B = {"model_type": "qwen3", "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 64,
             "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 25600, "vocab_size": 151936,
             "tie_word_embeddings": False}  # fmt: skip


def _projections(scored_share: float) -> list[dict[str, Any]]:
    """Qwen3-8B and 32B from 128K to 700K tokens: GiB a rank (FSDP, checkpointing, bf16) at CP=8, the K/V a rank
    holds (its own keys and values kept, ring blocks in flight), and the fewest ranks (8 to 64) it fits on."""
    from gyre.train.budget import step_budget
    from gyre.train.memory import BF16, GIB, ModelShape

    print(
        "\nQwen3-8B and 32B, FSDP + checkpointing, bf16; GiB a rank at CP=8; K/V: a rank's own keys and values "
        "(one layer being recomputed) + ring blocks in flight; fewest ranks that fit (<= 90% of 80 GiB)"
    )
    print(f"{'model':<10}{'tokens':>9}{'GiB/rank':>10}{'activ.':>8}{'K/V':>7}{'fits':>6}{'fewest CP':>11}")
    rows = []
    for name, config in (("Qwen3-8B", QWEN3_8B), ("Qwen3-32B", QWEN3_32B)):
        shape = ModelShape.from_config(config)
        for tokens in (131_072, 262_144, 524_288, 700_000):

            def budget(cp: int, n: int = tokens, config: dict[str, Any] = config) -> Any:
                return step_budget(config, n, cp=cp, precision=BF16, checkpointing=True, optimizer_shards=cp,
                                   full_shard=True, scored_tokens=int(n * scored_share))  # fmt: skip

            b = budget(8)
            own_kv = 2 * 2 * shape.kv_size * -(-tokens // 8) * BF16.activation  # one layer, before/after rope
            kv = own_kv + b.memory["keys_values"]
            fewest = next((c for c in (8, 16, 32, 64) if budget(c).fits()), None)
            print(f"{name:<10}{tokens:>9,}{b.memory_bytes / GIB:>10.1f}{b.memory['activations'] / GIB:>8.1f}"
                  f"{kv / GIB:>7.1f}{'yes' if b.fits() else 'no':>6}{fewest or '> 64':>11}")  # fmt: skip
            rows.append({"model": name, "tokens": tokens, "gib_per_rank_cp8": b.memory_bytes / GIB,
                         "kv_gib_cp8": kv / GIB, "fits_cp8": b.fits(), "fewest_cp": fewest})  # fmt: skip
    return rows


PARTS: dict[str, Callable[[bool], dict[str, Any]]] = {"a": part_a, "b": part_b, "c": part_c, "d": part_d,
                                                      "e": part_e}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated parts to run (a,b,c,d,e)")
    parser.add_argument("--quick", action="store_true", help="small sizes: seconds, for the test suite")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument(
        "--tokens", type=int, default=700_000, help="(b): the execution's tokens (calls of 700)"
    )
    parser.add_argument("--fit-tokens", default="65536,131072,262144",
                        help="(b): CP=1 sizes fitted when CP=1 at --tokens would not fit in memory")  # fmt: skip
    parser.add_argument(
        "--cp1-fit", action="store_true", help="(b): fit CP=1 at --fit-tokens even where it fits"
    )
    parser.add_argument(
        "--c-sizes", default="8192,16384,32768,65536", help="(c): chain lengths of the tiny model"
    )
    parser.add_argument("--c-cps", default="1,2,4", help="(c): context-parallel sizes")
    args = parser.parse_args(argv)
    parts: dict[str, Callable[[bool], dict[str, Any]]] = dict(PARTS)
    fit = tuple(int(k) for k in args.fit_tokens.split(",") if k)
    parts["b"] = lambda quick: part_b(quick, args.tokens, fit, args.cp1_fit)
    sizes, cps = (tuple(int(k) for k in v.split(",") if k) for v in (args.c_sizes, args.c_cps))
    parts["c"] = lambda quick: part_c(quick, sizes, cps)
    figures = {p: parts[p](args.quick) for p in args.parts.split(",") if p}
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()

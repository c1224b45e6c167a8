"""xLong (issue 47): one execution of 700,000 tokens, stage by stage.

Parts, run with ``--parts a,d`` (default: all built so far):
  (a) a synthetic execution of ``calls`` x (``new_in`` + ``out``) tokens through records -> journal -> tree ->
      micro-steps: wall time and peak Python memory (tracemalloc) per stage; target < 1 GB and < 30 s in all.
  (d) the router's per-call work with 7K / 70K / 700K tokens of history (TITO: match the previous call, render and
      tokenize only the new messages, append to the previous ids), side by side; target 700K <= 2x 7K.
Parts (b), (c), (e) (training) are added by their owners as ``part_b`` ... with the same shape: a function that
returns a dict of figures and prints its table. ``--quick`` runs each part in seconds (the slow test tier).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


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
    from gyre.records import CallRecord, CallTiming

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
    from gyre.records import CallRecord
    from gyre.train.step import Rollout, build_step
    from gyre.train.tree import TrajectoryTree

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
    """The router's per-call TITO work with a long history: find the extended call, render the new messages,
    append their ids to the previous call's ids."""
    from gyre.models import init_model
    from gyre.router.render import ChatRenderer
    from gyre.router.sessions import Session, Turn

    with tempfile.TemporaryDirectory() as tmp:
        directory = model_dir or init_model(Path(tmp) / "tiny", preset="tiny", seed=0)
        renderer = ChatRenderer.from_model_dir(directory)
        histories = (7_000, 70_000) if quick else (7_000, 70_000, 700_000)
        reps = 5 if quick else 20
        result: dict[str, float] = {}
        words = " ".join(f"w{k}" for k in range(300))  # a long observation: ~600 tokens
        reply = {"role": "assistant", "content": "ok " * 50}
        for history in histories:
            per_turn = len(renderer.encode(words)) + 60  # the turn's tokens, template included (approximate)
            turns = max(1, history // per_turn)
            messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
            for k in range(turns):
                messages += [dict(reply), {"role": "user", "content": f"{k} {words}"}]
            ids = [1] * history
            session = Session(token="t", execution_id="e")
            times: list[float] = []
            for r in range(reps):
                prev = messages + [dict(reply)]
                turn = Turn(call_id=f"c{r}", raw_messages=prev[:-1], tools=None, reply=reply, full_ids=ids,
                            ended_with_eos=True)  # fmt: skip
                session.remember(turn, None)
                request = prev + [{"role": "user", "content": f"new {r} {words}"}]
                t0 = time.perf_counter()
                parent = session.find_extended(request, None)
                assert parent is turn
                new = renderer.render_extension(request[len(parent.raw_messages) + 1 :], None, True)
                full = parent.full_ids + new
                times.append(time.perf_counter() - t0)
                assert len(full) > history
                session.leaves.clear()
            result[f"{history}"] = statistics.median(times) * 1000
    print("\n(d) router render + tokenize per call (median ms)")
    base = result[str(histories[0])]
    for h in histories:
        print(
            f"  history {h:>8,} tokens: {result[str(h)]:8.3f} ms  ({result[str(h)] / base:.2f}x the 7K call)"
        )
    print("  target: 700K <= 2x 7K")
    return {"per_call_ms": result, "ratio_last": result[str(histories[-1])] / base}


PARTS: dict[str, Callable[[bool], dict[str, Any]]] = {"a": part_a, "d": part_d}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated parts to run (a,d)")
    parser.add_argument("--quick", action="store_true", help="small sizes: seconds, for the test suite")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    figures = {p: PARTS[p](args.quick) for p in args.parts.split(",") if p}
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()

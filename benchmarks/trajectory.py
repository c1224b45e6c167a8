"""Tree-packed vs per-path training of branched agent executions: tokens computed and forward+backward time.

    python benchmarks/trajectory.py [--executions 4] [--token-budget 4096] [--journal RUN/journal/calls.jsonl ...]

Each workload is a set of executions (call records, the way the router journals them). Per workload, in one run,
``build_step`` makes the micro-steps of one optimizer step with ``packing="tree"`` and ``packing="path"`` at
``jmax`` = 1, 5 and unbounded; the table gives the tokens each computes, the trainable tokens, the forward+backward
time over all micro-steps (``token_logprobs`` + ``policy_loss`` + ``backward`` on the tiny model, CPU; each
micro-step best of ``--trials`` shuffled, alternating trials) and ``build_step``'s own time as a share of that. A
micro-step that several configurations share (a linear chain has one path whatever ``jmax``) is timed once.

Workloads:
- ``agent``: synthetic long agent runs. A system prompt shared by every call, a main conversation in which each call
  extends the previous one token-exactly (tool outputs, then model outputs), compactions (a ``main-summary`` call
  extending the current context, then a fresh main branch from system prompt + instruction + summary) and
  sub-agents (a branch from system prompt + task, several turns each, whose answer is the next tool output).
- ``edited``: the same runs where the harness also re-renders history every ``--edit-every`` turns (it drops the
  reasoning of the last reply, as templates of reasoning models do), so that call does not extend the previous one:
  it is a new branch sharing the whole history up to that reply. This is where paths share long prefixes.
- ``journal``: real router records (``--journal``, repeatable), one execution per ``session``.

Threads: OpenMP threads wait passively (``OMP_WAIT_POLICY=PASSIVE`` unless the environment says otherwise). With
the default spin-waiting, a 2-thread backward on this shared 2-vCPU machine ran 15-50x slower whenever another
process wanted a core (a 1,000-token micro-step: 2-8 s instead of 0.15 s), for minutes at a time, which no number
of trials averages away; passive waiting keeps it at 0.24-0.4 s.

Writes ``benchmarks/results/trajectory.json``.
"""

from __future__ import annotations

import os

# read once, when torch starts OpenMP: so before importing it (see "Threads" above)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import gc
import hashlib
import json
import random
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

import gyre.train
from gyre.engine.models import init_model
from gyre.journal.records import CallRecord, CallTiming, Role, decode_record
from gyre.train.loss import chain_segments, token_logprobs
from gyre.train.objective import policy_loss
from gyre.train.prefixtree import TrajectoryTree
from gyre.train.step import MicroStep, Packing, Rollout, StepData, build_step

JMAXES: tuple[int | None, ...] = (1, 5, None)
PACKINGS: tuple[Packing, ...] = ("tree", "path")
BEHAVIOUR_LOGPROB = -5.6  # about what the random tiny model gives a random token: importance ratios near 1


# ---- synthetic executions -------------------------------------------------------------------------------------
class _Conversation:
    """One conversation a harness keeps (the main agent's or a sub-agent's) and the calls it makes."""

    def __init__(self, ex: _Execution, opening: list[int]) -> None:
        self.ex = ex
        self.tokens = list(opening)  # what rendering the conversation now gives
        self.last: str | None = None  # the call the next one extends, when ``tokens`` is its input + output

    def call(self, role: Role, new: list[int], n_out: int, *, edit: bool = False) -> list[int]:
        """One model call after appending ``new``; ``edit``: the next render drops this reply's reasoning."""
        ex = self.ex
        out = ex.text(n_out)
        if self.last is not None:
            parent, prefix, new_input = self.last, len(self.tokens), new
        else:
            parent, prefix, new_input = None, 0, self.tokens + new
        call_id = f"{ex.session}/{len(ex.records)}"
        ex.records.append(CallRecord(
            call_id=call_id, session=ex.session, role=role, parent_call_id=parent, prefix_len=prefix,
            new_input_ids=new_input, output_ids=out,
            output_logprobs=[BEHAVIOUR_LOGPROB + ex.rng.gauss(0.0, 0.05) for _ in out], finish_reason="stop",
            weight_version=0, cell="bench", timing=CallTiming(0.0, 0.0, 0.0),
        ))  # fmt: skip
        self.tokens = self.tokens + new + out
        self.last = call_id
        if edit:  # reasoning dropped: the next call starts with different tokens from here on
            reasoning = ex.rng.randint(n_out // 3, max(n_out // 3, 2 * n_out // 3))
            marker = (out[0] + 1) % 256  # the re-rendered reply differs from its first token on
            self.tokens = self.tokens[: len(self.tokens) - n_out] + [marker] + out[reasoning:]
            self.last = None
        return out


class _Execution:
    """The records of one synthetic execution (see the module's ``agent`` workload)."""

    def __init__(self, session: str, system: list[int], args: argparse.Namespace, edit_every: int) -> None:
        self.session = session
        self.rng = random.Random(session)
        self.records: list[CallRecord] = []
        self.model_tokens: tuple[int, int] = args.model_tokens
        rng, a = self.rng, args
        instruction = self.text(rng.randint(50, 150))
        turns = rng.randint(*a.main_turns)
        segments = a.compactions + 1
        # the main turns after which the agent compacts its context, and after which it starts a sub-agent
        cuts = {round(turns * (k + 1) / segments) for k in range(a.compactions)}
        spawns = set(rng.sample(range(1, turns), min(a.subagents, turns - 1)))
        main = _Conversation(self, system + instruction)
        tool: list[int] = []
        for turn in range(1, turns + 1):
            main.call("main", tool, self.model_len(), edit=edit_every > 0 and turn % edit_every == 0)
            tool = self.text(rng.randint(*a.tool_tokens))
            if turn in spawns:
                sub = _Conversation(self, system + self.text(rng.randint(50, 150)))
                sub_tool: list[int] = []
                answer: list[int] = []
                for sub_turn in range(1, rng.randint(*a.subagent_turns) + 1):
                    edit = edit_every > 0 and sub_turn % edit_every == 0
                    answer = sub.call("sub-agent", sub_tool, self.model_len(), edit=edit)
                    sub_tool = self.text(rng.randint(*a.tool_tokens))
                # the sub-agent's last reply comes back to the main agent as a tool output
                tool = answer[-rng.randint(20, 60) :]
            if turn in cuts:
                summary = main.call("main-summary", tool + self.text(30), rng.randint(100, 200))
                main = _Conversation(self, system + instruction + self.text(10) + summary)
                tool = []

    def text(self, n: int) -> list[int]:
        """``n`` random byte tokens (ids < 256: the tiny model's vocabulary)."""
        return [self.rng.randrange(256) for _ in range(n)]

    def model_len(self) -> int:
        """The length of a model output."""
        return self.rng.randint(*self.model_tokens)


def synthetic(args: argparse.Namespace, edit_every: int) -> list[list[CallRecord]]:
    """``args.executions`` seeded executions; every execution shares one system prompt."""
    rng = random.Random(f"{args.seed}/system")
    system = [rng.randrange(256) for _ in range(args.system_tokens)]
    return [_Execution(f"{args.seed}/{i}", system, args, edit_every).records for i in range(args.executions)]


def from_journals(paths: list[Path], limit: int | None) -> list[list[CallRecord]]:
    """Router records grouped by session (each an execution), in journal order; the first ``limit`` sessions."""
    sessions: dict[str, list[CallRecord]] = defaultdict(list)
    for path in paths:
        for line in path.read_bytes().splitlines():
            if line.strip():
                record = decode_record(line)
                sessions[record.session].append(record)
    return list(sessions.values())[:limit]


def rollouts(executions: list[list[CallRecord]], seed: int) -> list[Rollout]:
    """Executions as rollouts in groups of 4 with seeded rewards (the values do not change the compute)."""
    rng = random.Random(f"{seed}/rewards")
    return [
        Rollout(execution_id=f"e{i}", group=f"g{i // 4}", reward=rng.random(), records=records)
        for i, records in enumerate(executions)
    ]


# ---- measuring ------------------------------------------------------------------------------------------------
def fingerprint(micro: MicroStep) -> str:
    """Equal for micro-steps that compute the same thing (ids, positions and attention)."""
    return hashlib.sha256(
        json.dumps([micro.input_ids, micro.position_ids, micro.parents]).encode()
    ).hexdigest()


def sequences(micro: MicroStep) -> list[list[int]]:
    """The packed sequences of a micro-step, each as its tokens' local parents (a sequence starts without one)."""
    starts = [i for i, p in enumerate(micro.parents) if p < 0]
    return [
        [p - start if p >= 0 else -1 for p in micro.parents[start:end]]
        for start, end in zip(starts, [*starts[1:], len(micro.parents)], strict=True)
    ]


def is_chain(parents: list[int]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))


def attention(step: StepData) -> tuple[int, int]:
    """Query-key pairs: (a dense masked kernel per sequence: sum of its length squared, the ancestor pairs).

    The second is what attention restricted to each token's ancestors would compute; causal kernels on a chain
    compute about half the first.
    """
    dense = allowed = 0
    for m in step.micro_steps:
        for parents in sequences(m):
            dense += len(parents) ** 2
            depth: list[int] = []
            for p in parents:
                depth.append(depth[p] + 1 if p >= 0 else 0)
            allowed += sum(depth) + len(depth)
    return dense, allowed


def forward_backward(model: Any, micro: MicroStep) -> float:
    """Seconds for ``token_logprobs`` + ``policy_loss`` + ``backward`` of one micro-step."""
    model.zero_grad(set_to_none=True)
    gc.collect()
    start = time.perf_counter()
    policy_loss(token_logprobs(model, micro), micro).backward()
    return time.perf_counter() - start


def mask_time(micro: MicroStep) -> float:
    """Seconds ``chain_segments`` takes over the micro-step's tree-shaped sequences (chains need none)."""
    trees = [parents for parents in sequences(micro) if not is_chain(parents)]
    start = time.perf_counter()
    for parents in trees:
        chain_segments(parents)
    return time.perf_counter() - start


def build(runs: list[Rollout], jmax: int | None, packing: Packing, args: argparse.Namespace) -> StepData:
    """The step ``build_step`` makes of ``runs``: trees, selection, weights and packing."""
    return build_step(runs, jmax=jmax, packing=packing, token_budget=args.token_budget, seed=args.seed)


def build_time(runs: list[Rollout], jmax: int | None, packing: Packing, args: argparse.Namespace) -> float:
    """Seconds ``build_step`` takes."""
    start = time.perf_counter()
    build(runs, jmax, packing, args)
    return time.perf_counter() - start


def measure(
    model: Any, name: str, executions: list[list[CallRecord]], args: argparse.Namespace, console: Console
) -> dict[str, Any]:
    """Every (jmax, packing) of one workload.

    Each distinct micro-step is timed once per trial, all of them in a seeded shuffled order (tree and path ones
    interleaved, so a slow spell of this shared machine hits both), best of ``args.trials``; a configuration's time
    is the sum over its micro-steps.
    """
    runs = rollouts(executions, args.seed)
    configs: dict[tuple[str, Packing], dict[str, Any]] = {}
    keys: dict[tuple[str, Packing], list[str]] = {}  # configuration -> its micro-steps' fingerprints
    distinct: dict[str, MicroStep] = {}
    first_of: dict[tuple[str, ...], str] = {}  # micro-steps -> the configuration that computes them first
    for jmax in JMAXES:
        for packing in PACKINGS:
            key = (str(jmax), packing)
            step = build(runs, jmax, packing, args)
            keys[key] = [fingerprint(m) for m in step.micro_steps]
            distinct.update(zip(keys[key], step.micro_steps, strict=True))
            dense, allowed = attention(step)
            configs[key] = {
                "jmax": jmax,
                "packing": packing,
                "paths": sum(step.paths.values()),
                "computed_tokens": step.computed_tokens,
                "trainable_tokens": step.trainable_tokens,
                "micro_steps": len(step.micro_steps),
                "longest_micro_step": max(len(m.input_ids) for m in step.micro_steps),
                "attention_dense_pairs": dense,
                "attention_allowed_pairs": allowed,
                "same_as": first_of.get(tuple(sorted(keys[key]))),
                "build_s": float("inf"),
            }
            first_of.setdefault(tuple(sorted(keys[key])), f"{packing}@jmax={jmax}")
    order = sorted(distinct)
    random.Random(args.seed).shuffle(order)
    best = dict.fromkeys(order, float("inf"))
    best_mask = dict.fromkeys(order, float("inf"))
    for trial in range(args.trials):
        for fp in order:
            best[fp] = min(best[fp], forward_backward(model, distinct[fp]))
            best_mask[fp] = min(best_mask[fp], mask_time(distinct[fp]))
        for key, row in configs.items():
            row["build_s"] = min(row["build_s"], build_time(runs, row["jmax"], row["packing"], args))
            row["fwd_bwd_s"] = sum(best[fp] for fp in keys[key])
            row["mask_s"] = sum(best_mask[fp] for fp in keys[key])
        done = ", ".join(
            f"{p}@{j} {r['fwd_bwd_s']:.1f} s" for (j, p), r in configs.items() if not r["same_as"]
        )
        console.print(f"[dim]{name} trial {trial + 1}/{args.trials} ({len(order)} micro-steps): {done}[/dim]")
    stored = [sum(len(r.new_input_ids) + len(r.output_ids) for r in ex) for ex in executions]
    trees = [TrajectoryTree(ex) for ex in executions]
    return {
        "workload": name,
        "executions": len(executions),
        "calls": sum(len(ex) for ex in executions),
        "stored_tokens": sum(stored),  # the records' tokens (a new branch stores its whole input)
        "tree_tokens": [t.size for t in trees],  # each execution's tree (each shared prefix once)
        "leaves": [len(t.leaves()) for t in trees],
        "rows": list(configs.values()),
    }


def profile(model: Any, step: StepData, console: Console) -> list[dict[str, Any]]:
    """Where the forward+backward of ``step``'s largest micro-step goes (torch profiler, self CPU time)."""
    micro = max(step.micro_steps, key=lambda m: len(m.input_ids))
    model.zero_grad(set_to_none=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        policy_loss(token_logprobs(model, micro), micro).backward()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    top = [{"op": e.key, "self_s": e.self_cpu_time_total / 1e6, "share": e.self_cpu_time_total / total}
           for e in events[:8]]  # fmt: skip
    table = Table(title=f"Profile: forward+backward of one {len(micro.input_ids):,}-token tree micro-step")
    for col in ("op", "self time", "share"):
        table.add_column(col, justify="right" if col != "op" else "left")
    for t in top:
        table.add_row(t["op"], f"{t['self_s']:.2f} s", f"{t['share']:.0%}")
    console.print(table)
    return top


# ---- reporting ------------------------------------------------------------------------------------------------
def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def report(results: list[dict[str, Any]], console: Console, args: argparse.Namespace) -> dict[str, Any]:
    title = (
        f"Tree-packed vs per-path, token budget {args.token_budget:,}, {args.threads} thread(s), "
        f"each micro-step best of {args.trials}"
    )
    table = Table(title=title)
    for col in ("workload", "jmax", "paths", "trainable", "tree tok", "path tok", "tok path/tree", "tree f+b",
                "path f+b", "time path/tree", "build tree", "build path"):  # fmt: skip
        table.add_column(col, justify="left" if col == "workload" else "right")
    summary: dict[str, Any] = {}
    for w in results:
        by = {(str(r["jmax"]), r["packing"]): r for r in w["rows"]}
        for jmax in JMAXES:
            tree, path = by[(str(jmax), "tree")], by[(str(jmax), "path")]
            assert tree["trainable_tokens"] == path["trainable_tokens"]
            table.add_row(
                w["workload"], "inf" if jmax is None else str(jmax), str(tree["paths"]),
                f"{tree['trainable_tokens']:,}", f"{tree['computed_tokens']:,}", f"{path['computed_tokens']:,}",
                _ratio(path["computed_tokens"], tree["computed_tokens"]),
                f"{tree['fwd_bwd_s']:.1f} s", f"{path['fwd_bwd_s']:.1f} s", _ratio(path["fwd_bwd_s"], tree["fwd_bwd_s"]),
                f"{tree['build_s'] * 1e3:.0f} ms ({tree['build_s'] / tree['fwd_bwd_s']:.2%})",
                f"{path['build_s'] * 1e3:.0f} ms ({path['build_s'] / path['fwd_bwd_s']:.2%})",
            )  # fmt: skip
        summary[w["workload"]] = {}
        for packing in PACKINGS:
            five, unbounded = by[("5", packing)], by[("None", packing)]
            summary[w["workload"]][packing] = {
                "jmax5_over_unbounded_time": five["fwd_bwd_s"] / unbounded["fwd_bwd_s"],
                "jmax5_over_unbounded_tokens": five["computed_tokens"] / unbounded["computed_tokens"],
            }
    console.print(table)
    lines = Table(title="jmax=5 / unbounded (the paper: 74.8% of forward-backward time)")
    for col in ("workload", "tree time", "tree tokens", "path time", "path tokens"):
        lines.add_column(col, justify="left" if col == "workload" else "right")
    for name, s in summary.items():
        lines.add_row(
            name, f"{s['tree']['jmax5_over_unbounded_time']:.1%}", f"{s['tree']['jmax5_over_unbounded_tokens']:.1%}",
            f"{s['path']['jmax5_over_unbounded_time']:.1%}", f"{s['path']['jmax5_over_unbounded_tokens']:.1%}",
        )  # fmt: skip
    console.print(lines)
    costs = Table(
        title="Where the time goes at jmax=inf: path / tree (attention pairs: dense per sequence, ancestors only)"
    )
    for col in ("workload", "tokens", "dense attention", "ancestor attention", "fwd+bwd time",
                "segmenting share tree", "segmenting share path"):  # fmt: skip
        costs.add_column(col, justify="left" if col == "workload" else "right")
    for w in results:
        tree, path = (next(r for r in w["rows"] if r["jmax"] is None and r["packing"] == p) for p in PACKINGS)
        costs.add_row(
            w["workload"], _ratio(path["computed_tokens"], tree["computed_tokens"]),
            _ratio(path["attention_dense_pairs"], tree["attention_dense_pairs"]),
            _ratio(path["attention_allowed_pairs"], tree["attention_allowed_pairs"]),
            _ratio(path["fwd_bwd_s"], tree["fwd_bwd_s"]),
            f"{tree['mask_s'] / tree['fwd_bwd_s']:.1%}", f"{path['mask_s'] / path['fwd_bwd_s']:.1%}",
        )  # fmt: skip
    console.print(costs)
    for w in results:
        same = [f"{r['packing']}@jmax={r['jmax']} = {r['same_as']}" for r in w["rows"] if r["same_as"]]
        console.print(
            f"{w['workload']}: {w['executions']} executions, {w['calls']} calls, {w['stored_tokens']:,} tokens in "
            f"records, trees of {min(w['tree_tokens']):,}-{max(w['tree_tokens']):,} tokens with "
            f"{min(w['leaves'])}-{max(w['leaves'])} leaves; micro-steps tree/path at jmax=inf: "
            + "/".join(str(r["micro_steps"]) for r in w["rows"] if r["jmax"] is None)
            + (f"; computed once: {', '.join(same)}" if same else "")
        )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    pair = lambda s: tuple(int(x) for x in s.split(","))  # noqa: E731
    parser.add_argument("--model", type=Path, help="model directory (default: a fresh tiny model)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument(
        "--trials", type=int, default=3, help="forward+backward runs per configuration (best)"
    )
    parser.add_argument(
        "--token-budget", type=int, default=4096, help="micro-step budget (the mask is dense n x n)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workloads", default="agent,edited", help="synthetic workloads to run (or none)")
    parser.add_argument("--executions", type=int, default=4, help="synthetic executions per workload")
    parser.add_argument("--system-tokens", type=int, default=300)
    parser.add_argument(
        "--main-turns", type=pair, default=(6, 9), help="main-agent calls per execution: lo,hi"
    )
    parser.add_argument("--compactions", type=int, default=2, help="per execution")
    parser.add_argument("--subagents", type=int, default=3, help="per execution")
    parser.add_argument("--subagent-turns", type=pair, default=(2, 3), help="calls per sub-agent: lo,hi")
    parser.add_argument("--tool-tokens", type=pair, default=(50, 300), help="tool output length: lo,hi")
    parser.add_argument("--model-tokens", type=pair, default=(20, 200), help="model output length: lo,hi")
    parser.add_argument(
        "--edit-every", type=int, default=1, help="edited workload: re-render history every N turns"
    )
    parser.add_argument(
        "--journal", type=Path, action="append", default=[], help="a run's journal/calls.jsonl"
    )
    parser.add_argument(
        "--journal-sessions", type=int, default=4, help="first N sessions of the journals (0: all)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="profile the largest tree micro-step of each workload"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "trajectory.json")
    args = parser.parse_args()
    console = Console(width=180)
    torch.set_num_threads(args.threads)
    model_dir = args.model or init_model(Path(tempfile.mkdtemp()) / "tiny")

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    model.train()
    workloads: dict[str, list[list[CallRecord]]] = {}
    for name in filter(None, args.workloads.split(",")):
        if name not in ("agent", "edited"):
            parser.error(f"unknown workload {name!r}: agent, edited")
        workloads[name] = synthetic(args, args.edit_every if name == "edited" else 0)
    if args.journal:
        workloads["journal"] = from_journals(args.journal, args.journal_sessions or None)
    warm = build_step(rollouts(next(iter(workloads.values()))[:1], args.seed), token_budget=512)
    forward_backward(model, warm.micro_steps[0])  # the first backward pays one-off set-up
    results, profiles = [], {}
    for name, executions in workloads.items():
        results.append(measure(model, name, executions, args, console))
        if args.profile:
            profiles[name] = profile(
                model, build(rollouts(executions, args.seed), None, "tree", args), console
            )
    summary = report(results, console, args)
    source = Path(gyre.train.__file__).parent
    out = {
        "source_sha256": {  # the code measured: others change it
            name: hashlib.sha256((source / name).read_bytes()).hexdigest()[:16]
            for name in ("loss.py", "step.py", "tree.py")
        },
        "threads": args.threads,
        "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "journal", "model")},
        "journals": [str(p) for p in args.journal],
        "workloads": results,
        "summary": summary,
        "profiles": profiles,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""The xLong effect (issue 55): one long agent execution folds into one path of the prefix tree, on every family.

    python benchmarks/family_chains.py [--calls 60] [--user-every 10] [--result-chars 300] [--families all]

One execution on Qwen3's real chat template (`tests/model_families.py`) goes through the in-process router and a
scripted engine that writes Qwen3's exact replies: each a ``<think>`` block, a sentence and one tool call; each tool
result a few hundred characters; every ``--user-every`` calls a new user message, as agents get them. It runs twice,
side by side: ``router.continuation = "exact"`` (every later call continues from the ids the model was served and
produced) and ``"canonical"`` (the behaviour before issue 55: where the template's own render of the earlier reply
differs, as Qwen3's drops the ``<think>`` of turns before the last user message, the call is rendered anew, a new
branch). Its records go through the trainer's own step builder (`gyre.train.step.build_step`, the default
``[trajectory]`` Jmax) and the table shows what the tree trains and computes against the execution's own length (its
last call's input + output). The target: one path, every sampled token trained, computed <= 1.05x the length.

Then one line per other family of `tests/model_families.py`, the same execution in its own format (those that reason
reason on every reply they can; a family whose template wants an assistant reply before a user message gets a reply
without a call there). Prints the tables and writes JSON (``--out``, default ``benchmarks/results/family_chains.json``).
``--quick`` runs 20 calls and three families.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TARGET_RATIO = 1.05
TOOLS: Any = [
    {"type": "function", "function": {"name": "bash", "description": "Run a command.", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
]  # fmt: skip
# per family, what its template needs to think (the test's THINKS): Qwen3, GLM and gpt-oss think by default,
# DeepSeek-V3.1 when asked, and then only where its generation prompt opens <think> (after a user message)
THINKS: dict[str, dict[str, Any] | None] = {
    "qwen3": None,
    "glm45": None,
    "deepseekv31": {"thinking": True},
    "gpt-oss": None,
}
WORDS = ("src", "tests", "build", "config", "module", "handler", "parser", "cache", "index", "router", "worker")  # fmt: skip


def _tests_on_path() -> None:
    """`tests/` importable: the families' templates and replies (`model_families`), the scripted engine (`fakes`)."""
    tests = str(HERE.parent / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


def _result(i: int, chars: int, rng: random.Random) -> str:
    """A tool result of about ``chars`` characters: a directory listing, different on every call."""
    lines = [f"RESULT#{i}"]
    while sum(len(line) + 1 for line in lines) < chars:
        name = "/".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
        lines.append(f"-rw-r--r-- 1 agent agent {rng.randint(10, 99999):>6} {name}_{rng.randint(0, 999)}.py")
    return "\n".join(lines)[:chars]


def _thought(i: int, rng: random.Random) -> str:
    """A reasoning block of one to three sentences."""
    sentences = [f"Step {i}: the last listing shows {rng.choice(WORDS)} files.",
                 f"I should look at {rng.choice(WORDS)} next, then check {rng.choice(WORDS)}.",
                 "Nothing failed so far, so keep going."]  # fmt: skip
    return " ".join(sentences[: rng.randint(1, 3)])


async def _execute(
    router: Any, family: str, state: dict[str, Any], calls: int, user_every: int, result_chars: int, seed: int
) -> None:
    """One execution of ``calls`` calls through ``router``; ``state`` tells the scripted model what to reply."""
    from gyre.router.openai_types import ChatRequest
    from model_families import HISTORY_NEEDS

    rng = random.Random(seed)
    before_user = HISTORY_NEEDS[family].reply_before_user
    token = router.open_session(f"{family}-{router.cfg.continuation}")
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent. Run commands."},
                                      {"role": "user", "content": "Survey the repository, part 0."}]  # fmt: skip
    for i in range(calls):
        user_next = (i + 1) % user_every == 0 and i + 1 < calls
        state.update(i=i, call=not (user_next and before_user), thought=_thought(i, rng))
        req = ChatRequest(
            model="", messages=list(messages), tools=TOOLS, chat_template_kwargs=THINKS.get(family)
        )
        message = (await router.chat(token, req))["choices"][0]["message"]
        messages.append(message)  # echoed as the client got it, reasoning included
        for call in message.get("tool_calls") or []:
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": _result(i, result_chars, rng)}
            )
        if user_next:
            messages.append({"role": "user", "content": f"Good. Now survey part {(i + 1) // user_every}."})


def _script(family: str, tokenizer: Any, state: dict[str, Any]) -> Any:
    """The scripted model: the family's exact reply for the call the driver is making."""
    from model_families import reply_text

    think_id = tokenizer.get_vocab().get("<think>")

    def reply(ids: list[int]) -> str:
        thinking = state["thought"] if family in THINKS else None
        if family == "deepseekv31" and ids[-1] != think_id:
            thinking = None  # V3.1 thinks only where its generation prompt opens <think>
        if not state["call"]:
            return reply_text(family, reasoning=thinking, content=f"Part {state['i']} surveyed.")
        # Llama 3.1 replies with a call and nothing else
        say = "" if family == "llama3" else f"Listing step {state['i']}."
        return reply_text(family, reasoning=thinking, content=say,
                          calls=[("bash", {"command": f"ls -la part{state['i']}"})])  # fmt: skip

    return reply


def run(
    family: str, continuation: str, calls: int, user_every: int, result_chars: int, seed: int = 0
) -> list[Any]:
    """The records of one execution on ``family`` with ``router.continuation = continuation``."""
    _tests_on_path()
    from fakes import ScriptedEngine
    from gyre.config import RouterConfig
    from gyre.router.render import ChatRenderer
    from gyre.router.routing import Router
    from model_families import FAMILIES, family_tokenizer

    tokenizer = family_tokenizer(family)
    state: dict[str, Any] = {}
    with ScriptedEngine(tokenizer, _script(family, tokenizer, state), stops=FAMILIES[family].stops) as engine:
        cfg = RouterConfig(engines=[engine.url], continuation=continuation)  # type: ignore[arg-type]
        router = Router(cfg, renderer=ChatRenderer(tokenizer))

        async def go() -> list[Any]:
            try:
                await _execute(router, family, state, calls, user_every, result_chars, seed)
                [session] = router.sessions._sessions.values()
                return list(session.records)
            finally:
                await router.aclose()

        return asyncio.run(go())


def fold(records: list[Any], jmax: int | None) -> dict[str, Any]:
    """What the trainer's step builder makes of one execution's records: paths, tokens trained and computed."""
    from gyre.train.prefixtree import TrajectoryTree
    from gyre.train.step import Rollout, build_step

    last = records[-1]
    length = last.prefix_len + len(last.new_input_ids) + len(last.output_ids)
    sampled = sum(len(r.output_ids) for r in records)
    tree = TrajectoryTree(records)
    # scripted output is not the policy's: trained as demonstrations, which select and pack as the policy's do
    rollout = Rollout(execution_id="e0", group="g", reward=1.0, records=records)
    step = build_step([rollout], jmax=jmax, token_budget=tree.size + 1, objective="supervised")
    kinds = Counter(r.divergence.kind for r in records if r.divergence is not None)
    return {"calls": len(records), "branches": sum(r.parent_call_id is None for r in records),
            "divergences": dict(sorted(kinds.items())), "leaves": len(tree.leaves()), "paths": step.paths["e0"],
            "sampled_tokens": sampled, "trained_tokens": step.trainable_tokens,
            "trained_share": step.trainable_tokens / sampled, "tree_tokens": tree.size,
            "computed_tokens": step.computed_tokens, "length_tokens": length,
            "computed_ratio": step.computed_tokens / length}  # fmt: skip


def measure(family: str, continuation: str, args: argparse.Namespace, jmax: int | None) -> dict[str, Any]:
    """One execution run and folded."""
    records = run(family, continuation, args.calls, args.user_every, args.result_chars, args.seed)
    return {"family": family, "continuation": continuation, **fold(records, jmax)}


def _print_main(
    exact: dict[str, Any], canonical: dict[str, Any], jmax: int | None, args: argparse.Namespace
) -> None:
    kinds = sorted(set(exact["divergences"]) | set(canonical["divergences"]))
    rows: list[tuple[str, Any, Any]] = [
        ("calls", exact["calls"], canonical["calls"]),
        ("branches (records without parent)", exact["branches"], canonical["branches"]),
        *[(f"records with divergence '{k}'", exact["divergences"].get(k, 0), canonical["divergences"].get(k, 0))
          for k in kinds],
        ("tree leaves / paths selected", f"{exact['leaves']} / {exact['paths']}",
         f"{canonical['leaves']} / {canonical['paths']}"),
        ("sampled tokens", f"{exact['sampled_tokens']:,}", f"{canonical['sampled_tokens']:,}"),
        ("share of them trained", f"{exact['trained_share']:.1%}", f"{canonical['trained_share']:.1%}"),
        ("tree tokens (every path)", f"{exact['tree_tokens']:,}", f"{canonical['tree_tokens']:,}"),
        ("tokens computed (the Jmax paths)", f"{exact['computed_tokens']:,}", f"{canonical['computed_tokens']:,}"),
        ("execution length (last input + output)", f"{exact['length_tokens']:,}", f"{canonical['length_tokens']:,}"),
        ("computed / length", f"{exact['computed_ratio']:.3f}x", f"{canonical['computed_ratio']:.3f}x"),
    ]  # fmt: skip
    print(f"\nqwen3: one execution of {args.calls} calls, a user message every {args.user_every}, tool results of "
          f"{args.result_chars} characters; Jmax {jmax or 'unbounded'} (the trainer's default [trajectory] jmax)")  # fmt: skip
    print(f"{'':<42}{'exact (now)':>16}{'canonical (before)':>20}")
    for name, a, b in rows:
        print(f"{name:<42}{a!s:>16}{b!s:>20}")
    met = exact["branches"] == 1 and exact["trained_share"] == 1.0 and exact["computed_ratio"] <= TARGET_RATIO
    print(
        f"target (exact): 1 branch, 100% trained, computed <= {TARGET_RATIO}x length: {'met' if met else 'NOT met'}"
    )


def _print_families(rows: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    print(
        "\nevery family, the same execution; each column exact | canonical (tree leaves: branches the tree kept apart)"
    )
    print(f"{'family':<13}{'reasons':>8}{'branches':>12}{'tree leaves':>14}{'trained':>14}{'computed/length':>18}"
          "  divergences (exact)")  # fmt: skip
    for e, c in rows:
        reasons = "yes" if e["family"] in THINKS else "no"
        kinds = ", ".join(f"{k} {n}" for k, n in e["divergences"].items()) or "-"
        print(f"{e['family']:<13}{reasons:>8}{e['branches']:>6} | {c['branches']:<3}{e['leaves']:>8} | {c['leaves']:<3}"
              f"{e['trained_share']:>7.0%} | {c['trained_share']:<4.0%}"
              f"{e['computed_ratio']:>9.3f} | {c['computed_ratio']:<6.3f}  {kinds}")  # fmt: skip


def main() -> None:
    from gyre.config import TrajectoryConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--user-every", type=int, default=10, help="a new user message after every N calls")
    parser.add_argument("--result-chars", type=int, default=300, help="characters of each tool result")
    parser.add_argument("--families", default="all", help="comma-separated other families; 'all' or 'none'")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="20 calls, three other families")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "family_chains.json")
    args = parser.parse_args()
    _tests_on_path()
    from model_families import FAMILIES

    if args.quick:
        args.calls = min(args.calls, 20)
    jmax = TrajectoryConfig().jmax or None
    exact, canonical = (measure("qwen3", c, args, jmax) for c in ("exact", "canonical"))
    _print_main(exact, canonical, jmax, args)
    names = (
        sorted(FAMILIES)
        if args.families == "all"
        else []
        if args.families == "none"
        else args.families.split(",")
    )
    names = [n for n in names if n != "qwen3"][: 3 if args.quick else None]
    families = [(measure(n, "exact", args, jmax), measure(n, "canonical", args, jmax)) for n in names]
    if families:
        _print_families(families)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figures = {"calls": args.calls, "user_every": args.user_every, "result_chars": args.result_chars,
               "jmax": jmax, "target_ratio": TARGET_RATIO, "qwen3": {"exact": exact, "canonical": canonical},
               "families": {e["family"]: {"exact": e, "canonical": c} for e, c in families}}  # fmt: skip
    args.out.write_text(json.dumps(figures, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()

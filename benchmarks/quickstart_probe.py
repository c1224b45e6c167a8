"""Can the tiny model learn the ``toy`` suite's one skill (copy the file name a tool just printed into the next
command) by supervised training on the scripted expert, and how fast? The probe behind issue 13's quickstart recipe.

    python benchmarks/quickstart_probe.py [--profile tiny|lean|full] [--window-steps 420] [--full-steps 170]
                                          [--window-tokens 160] [--tasks 400]

The expert's conversations are rendered offline with the tiny model's chat template, exactly as the built-in agent
sends them (its tool schemas, Hermes tool calls, ``exit code: 0\\nstdout:\\n...`` tool results): ``full`` is today's
built-in agent (six tools, its system prompt, the toy instruction; ~2.9k tokens of prompt), ``lean`` keeps only
``bash`` and ``submit`` and a one-line system prompt, ``tiny`` also shortens the instruction. Two stages, each
optional: (1) ``--window-steps`` on short windows (the last ``--window-tokens`` tokens up to the end of one
assistant turn, positions kept at their place in the whole conversation, loss on that turn only), (2)
``--full-steps`` on whole conversations (loss on every assistant turn). Measured every few steps, teacher-forced on
held-out tasks (``toy`` seed 7): **copy-turn exactness**, the share of assistant turns that must copy a name
(every ``cat NAME`` after the first) whose every token is the model's argmax, on windows and on whole conversations.
The untrained model, and the fixed turns alone, score 0 on it.

Prints the curve and writes ``benchmarks/results/quickstart_probe.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from gyre.agents.builtin import SYSTEM_PROMPT, TOOLS
from gyre.models import init_model, load_tokenizer
from gyre.tasks.toy import END, START, TRAIL, make_task
from gyre.train.state import load_model

RESULTS = Path(__file__).parent / "results"
LEAN_SYSTEM = "Use the tools. Call submit when done."
TINY_INSTRUCTION = "Follow the chain: cat NAME | tee -a trail, from start; submit at end."
Example = tuple[
    list[int], list[int], bool, int
]  # tokens, loss mask, a copy turn, position of the first token


def conversation(task: Any, profile: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[int]]:
    """The expert's whole conversation on ``task``: messages, tools, indices of the assistant messages."""
    system, tools = (SYSTEM_PROMPT, TOOLS) if profile == "full" else (LEAN_SYSTEM, [
        t for t in TOOLS if t["function"]["name"] in ("bash", "submit")])  # fmt: skip
    instruction = TINY_INSTRUCTION if profile == "tiny" else task.instruction
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": instruction},
    ]
    turns, name = [], START

    def call(tool: str, arguments: dict[str, str]) -> None:
        function = {"name": tool, "arguments": json.dumps(arguments)}
        messages.append({"role": "assistant", "content": "",
                         "tool_calls": [{"id": "call", "type": "function", "function": function}]})  # fmt: skip
        turns.append(len(messages) - 1)

    while True:
        call("bash", {"command": f"cat {name} | tee -a {TRAIL}"})
        shown = task.files[name].strip()
        messages.append(
            {"role": "tool", "tool_call_id": "call", "content": f"exit code: 0\nstdout:\n{shown}\n"}
        )
        if shown == END:
            break
        name = shown
    call("submit", {"answer": "done"})
    return messages, tools, turns


def encode(tok: Any, task: Any, profile: str) -> tuple[list[int], list[tuple[int, int, bool]]]:
    """Token ids of the whole conversation and its assistant turns as (start, end, copies a name)."""
    messages, tools, turns = conversation(task, profile)
    ids: list[int] = []
    spans = []
    for i in range(len(messages)):
        text = tok.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False)
        now = tok(text, add_special_tokens=False)["input_ids"]
        if i in turns:
            command = messages[i]["tool_calls"][0]["function"]["arguments"]
            spans.append((len(ids), len(now), f"cat {START} " not in command and "submit" not in command))
        ids = now
    return ids, spans


def examples(convs: list[tuple[list[int], list[tuple[int, int, bool]]]], window: int) -> list[Example]:
    """One example per assistant turn: the last ``window`` tokens up to its end (0: the whole conversation once)."""
    out: list[Example] = []
    for ids, spans in convs:
        if window == 0:
            mask = [0] * len(ids)
            for a, b, _ in spans:
                mask[a:b] = [1] * (b - a)
            out.append((ids, mask, False, 0))
            continue
        for a, b, copy in spans:
            lo = max(0, b - window)
            out.append((ids[lo:b], [0] * max(a - lo, 0) + [1] * (b - max(a, lo)), copy, lo))
    return out


def forward(model: Any, batch: list[Example]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded batch with true positions: (tokens, loss mask, logits)."""
    width = max(len(e[0]) for e in batch)
    x = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width))
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    positions = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (ids, loss_mask, _, lo) in enumerate(batch):
        pad = width - len(ids)
        x[row, pad:] = torch.tensor(ids)
        mask[row, pad:] = torch.tensor(loss_mask, dtype=torch.float32)
        attention[row, pad:] = 1
        positions[row, pad:] = torch.arange(lo, lo + len(ids))
    logits = model(x, attention_mask=attention, position_ids=positions).logits[:, :-1]
    return x, mask, logits


def copy_exact(model: Any, convs: list[tuple[list[int], list[tuple[int, int, bool]]]], window: int) -> float:
    """Share of copy turns whose every token is the argmax, on windows (``window``) or whole conversations (0)."""
    model.eval()
    hits = total = 0
    with torch.no_grad():
        for ids, spans in convs:
            if window:
                cases = [e for e in examples([(ids, spans)], window) if e[2]]
                for k in range(0, len(cases), 16):
                    x, mask, logits = forward(model, cases[k : k + 16])
                    right = (logits.argmax(-1) == x[:, 1:]) | (mask[:, 1:] == 0)
                    hits += int(right.all(-1).sum())
                    total += len(cases[k : k + 16])
            else:
                predicted = model(torch.tensor([ids])).logits[0].argmax(-1).tolist()
                for a, b, copy in spans:
                    if copy:
                        hits += all(predicted[k - 1] == ids[k] for k in range(a, b))
                        total += 1
    model.train()
    return hits / max(total, 1)


def stage(model: Any, data: list[Example], steps: int, lr: float, batch: int, evaluate: Any,
          every: int, name: str, curve: list[dict[str, Any]], started: float) -> None:  # fmt: skip
    """Train on ``data`` for ``steps`` steps; measure every ``every`` steps into ``curve`` (minutes since
    ``started``)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(0)
    for step in range(1, steps + 1):
        x, mask, logits = forward(model, rng.sample(data, min(batch, len(data))))
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
        loss = (losses * mask[:, 1:]).sum() / mask[:, 1:].sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step % every == 0 or step == steps:
            point = {"stage": name, "step": step, "minutes": (time.monotonic() - started) / 60,
                     "loss": loss.item(), **evaluate()}  # fmt: skip
            curve.append(point)
            print(" ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in point.items()),
                  flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", choices=["full", "lean", "tiny"], default="tiny")
    parser.add_argument("--window-tokens", type=int, default=160)
    parser.add_argument("--window-steps", type=int, default=420)
    parser.add_argument("--full-steps", type=int, default=170)
    parser.add_argument("--window-lr", type=float, default=3e-3)
    parser.add_argument("--full-lr", type=float, default=1e-3)
    parser.add_argument("--window-batch", type=int, default=32)
    parser.add_argument("--full-batch", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=400, help="demonstrations (toy tasks, seed 100)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="gyre-probe-") as tmp:
        init_model(Path(tmp) / "tiny")
        tok, model = load_tokenizer(Path(tmp) / "tiny"), load_model(Path(tmp) / "tiny")
    train = [encode(tok, make_task(i, seed=100), args.profile) for i in range(args.tasks)]
    held_out = [encode(tok, make_task(i, seed=7), args.profile) for i in range(16)]
    print(
        f"{args.profile}: {sum(len(ids) for ids, _ in train) / len(train):.0f} tokens a conversation",
        flush=True,
    )

    def evaluate() -> dict[str, float]:
        return {"window_copy_exact": copy_exact(model, held_out, args.window_tokens),
                "full_copy_exact": copy_exact(model, held_out, 0)}  # fmt: skip

    curve: list[dict[str, Any]] = []
    started = time.monotonic()
    if args.window_steps > 0:
        stage(model, examples(train, args.window_tokens), args.window_steps, args.window_lr, args.window_batch,
              evaluate, 50, "window", curve, started)  # fmt: skip
    if args.full_steps > 0:
        stage(model, examples(train, 0), args.full_steps, args.full_lr, args.full_batch, evaluate, 10, "full",
              curve, started)  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "quickstart_probe.json").write_text(json.dumps({"args": vars(args), "curve": curve}, indent=1))


if __name__ == "__main__":
    main()

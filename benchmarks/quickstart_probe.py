"""Can the tiny model learn the ``toy`` suite's one skill (copy the file name a tool just printed into the next
command) by supervised training on the scripted expert, and how fast? The probe behind issue 13's quickstart recipe.

    python benchmarks/quickstart_probe.py [--profile lean|tiny|full] [--window-steps 150] [--full-steps 50]
        [--window-tokens 384] [--window-start random|fixed] [--focus name|turn] [--alphabet 123456789] [--tasks 400]

The expert's conversations are rendered offline with the tiny model's chat template, exactly as the built-in agent
sends them (its tool schemas, Hermes tool calls, ``exit code: 0\\nstdout:\\n...`` tool results): ``full`` is the
built-in agent's default profile (six tools, its system prompt, the toy instruction; ~2.9k tokens of prompt),
``lean`` (what the quickstart uses) keeps only ``bash`` and ``submit`` and a one-line system prompt, ``tiny`` also
shortens the instruction. Two stages, each optional: (1) ``--window-steps`` on windows that end at one assistant
turn (``--focus turn``: the turn's end, loss on the turn) or at the name it copies (``--focus name``: loss on the
name's tokens only), positions kept at their place in the whole conversation, ``--window-tokens`` long
(``--window-start fixed``) or cut at random from the start of the tool result that turn answers (for a name:
where the tool showed it) back to ``--window-tokens`` (``random``, drawn again at each use; what `gyre sft` does); (2) ``--full-steps`` on whole conversations (loss on every
assistant turn). ``--alphabet`` draws the chain's names from other characters than the suite's (e.g. lowercase
letters, as the suite did before). Measured every few steps, teacher-forced on held-out tasks (``toy`` seed 7):
**name exactness**, the share of copy turns (each ``cat NAME`` after ``cat start``) whose name's every token is the
model's argmax, on windows and on whole conversations, and **turn exactness** on whole conversations (every token
of every assistant turn). The untrained model scores 0 on all three.

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

from gyre.agents.toolagent import LEAN_SYSTEM_PROMPT, LEAN_TOOLS, SYSTEM_PROMPT, TOOLS
from gyre.driver.sft import Window
from gyre.engine.models import init_model, load_tokenizer
from gyre.tasks import toy
from gyre.tasks.toy import END, START, TRAIL, make_task
from gyre.train.state import load_model

RESULTS = Path(__file__).parent / "results"
NAME_TOKENS = 3  # a name is 3 characters, a token each (the tiny model's tokenizer is byte-level)
TINY_INSTRUCTION = "Follow the chain: cat NAME | tee -a trail, from start; submit at end."
Span = tuple[
    int, int, int, int
]  # an assistant turn: start, end, its name's start (-1: no name to copy), result start
Example = tuple[
    list[int], list[int], int, int
]  # tokens, loss mask, its least length, position of the first token


def conversation(task: Any, profile: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[int]]:
    """The expert's whole conversation on ``task``: messages, tools, indices of the assistant messages."""
    system, tools = (SYSTEM_PROMPT, TOOLS) if profile == "full" else (LEAN_SYSTEM_PROMPT, [
        t for t in TOOLS if t["function"]["name"] in LEAN_TOOLS])  # fmt: skip
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


def encode(tok: Any, task: Any, profile: str) -> tuple[list[int], list[Span]]:
    """Token ids of the whole conversation and its assistant turns."""
    messages, tools, turns = conversation(task, profile)
    ids: list[int] = []
    spans: list[Span] = []
    cat = tok("cat ", add_special_tokens=False)["input_ids"]
    for i in range(len(messages)):
        text = tok.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False)
        now = tok(text, add_special_tokens=False)["input_ids"]
        if i in turns:
            command = json.loads(messages[i]["tool_calls"][0]["function"]["arguments"]).get("command", "")
            at = [k for k in range(len(ids), len(now)) if now[k : k + len(cat)] == cat]
            name = at[0] + len(cat) if at and command != f"cat {START} | tee -a {TRAIL}" else -1
            result = spans[-1][1] if spans else 0  # the tool result starts after the turn before
            spans.append((len(ids), len(now), name, result))
        ids = now
    return ids, spans


def examples(convs: list[tuple[list[int], list[Span]]], window: int, focus: str = "turn") -> list[Example]:
    """One example per assistant turn (``focus`` turn) or copied name (``name``): the last ``window`` tokens up to
    its end, the loss on it (0: the whole conversation once, the loss on every turn)."""
    out: list[Example] = []
    for ids, spans in convs:
        if window == 0:
            mask = [0] * len(ids)
            for a, b, _, _ in spans:
                mask[a:b] = [1] * (b - a)
            out.append((ids, mask, len(ids), 0))
            continue
        for a, b, name, result in spans:
            if focus == "name":
                if name < 0:
                    continue
                a, b = name, name + NAME_TOKENS
                shown = ids[a:b]
                result = max(k for k in range(a - len(shown) + 1) if ids[k : k + len(shown)] == shown)
            lo = max(0, b - window)
            out.append((ids[lo:b], [0] * max(a - lo, 0) + [1] * (b - max(a, lo)), b - result, lo))
    return out


def draw(example: Example, rng: random.Random) -> Example:
    """``example`` cut to a random length from its tool result's start (a name: where it was shown) back to all
    of it."""
    ids, mask, least, lo = example  # the mask is a suffix of ones: what `Window.trained` counts
    drawn = Window(session=0, input_ids=ids, start=lo, trained=sum(mask), least=least).draw(rng)
    return drawn.input_ids, mask[len(ids) - len(drawn.input_ids) :], least, drawn.start


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


def exactness(model: Any, convs: list[tuple[list[int], list[Span]]], window: int) -> dict[str, float]:
    """Name exactness on ``window``-token windows ending at each copied name, and name and turn exactness on whole
    conversations (see the module)."""
    model.eval()
    hits = total = 0
    names = name_total = turns = turn_total = 0
    with torch.no_grad():
        cases = examples(convs, window, "name")
        for k in range(0, len(cases), 16):
            x, mask, logits = forward(model, cases[k : k + 16])
            right = (logits.argmax(-1) == x[:, 1:]) | (mask[:, 1:] == 0)
            hits += int(right.all(-1).sum())
            total += len(cases[k : k + 16])
        for ids, spans in convs:
            predicted = model(torch.tensor([ids])).logits[0].argmax(-1).tolist()
            for a, b, name, _ in spans:
                turns += all(predicted[k - 1] == ids[k] for k in range(a + 1, b))
                turn_total += 1
                if name >= 0:
                    names += all(predicted[k - 1] == ids[k] for k in range(name, name + NAME_TOKENS))
                    name_total += 1
    model.train()
    return {"window_name_exact": hits / max(total, 1), "whole_name_exact": names / max(name_total, 1),
            "whole_turn_exact": turns / max(turn_total, 1)}  # fmt: skip


def stage(model: Any, data: list[Example], steps: int, lr: float, batch: int, evaluate: Any, every: int,
          name: str, curve: list[dict[str, Any]], started: float, random_start: bool = False) -> None:  # fmt: skip
    """Train on ``data`` for ``steps`` steps (10 of linear warm-up), each example's loss its mean over its trained
    tokens; measure every ``every`` steps into ``curve`` (minutes since ``started``)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warm = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10))
    rng = random.Random(0)
    for step in range(1, steps + 1):
        chosen = rng.sample(data, min(batch, len(data)))
        x, mask, logits = forward(model, [draw(e, rng) for e in chosen] if random_start else chosen)
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
        loss = ((losses * mask[:, 1:]).sum(-1) / mask[:, 1:].sum(-1).clamp(min=1)).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        warm.step()
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
    parser.add_argument("--profile", choices=["full", "lean", "tiny"], default="lean")
    parser.add_argument("--window-tokens", type=int, default=384)
    parser.add_argument("--window-steps", type=int, default=150)
    parser.add_argument("--window-start", choices=["random", "fixed"], default="random")
    parser.add_argument("--focus", choices=["name", "turn"], default="name")
    parser.add_argument("--alphabet", default=toy.ALPHABET, help="the characters of the chain's names")
    parser.add_argument("--full-steps", type=int, default=50)
    parser.add_argument("--window-lr", type=float, default=3e-3)
    parser.add_argument("--full-lr", type=float, default=1e-3)
    parser.add_argument("--window-batch", type=int, default=32)
    parser.add_argument("--full-batch", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="the model's initialisation and the batches")
    parser.add_argument("--tasks", type=int, default=400, help="demonstrations (toy tasks, seed 100)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", help="start from this model directory (default: a fresh tiny model)")
    args = parser.parse_args()
    toy.ALPHABET = args.alphabet
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="gyre-probe-") as tmp:
        start = Path(args.model) if args.model else init_model(Path(tmp) / "tiny", seed=args.seed)
        tok, model = load_tokenizer(start), load_model(start)
    train = [encode(tok, make_task(i, seed=100), args.profile) for i in range(args.tasks)]
    held_out = [encode(tok, make_task(i, seed=7), args.profile) for i in range(16)]
    print(
        f"{args.profile}: {sum(len(ids) for ids, _ in train) / len(train):.0f} tokens a conversation",
        flush=True,
    )

    def evaluate() -> dict[str, float]:
        return exactness(model, held_out, args.window_tokens)

    curve: list[dict[str, Any]] = []
    started = time.monotonic()
    if args.window_steps > 0:
        stage(model, examples(train, args.window_tokens, args.focus), args.window_steps, args.window_lr,
              args.window_batch, evaluate, 25, "window", curve, started, args.window_start == "random")  # fmt: skip
    if args.full_steps > 0:
        stage(model, examples(train, 0), args.full_steps, args.full_lr, args.full_batch, evaluate, 10, "full",
              curve, started)  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "quickstart_probe.json").write_text(json.dumps({"args": vars(args), "curve": curve}, indent=1))


if __name__ == "__main__":
    main()

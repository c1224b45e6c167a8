"""`gyre pretrain`: the quickstart's starting model, the tiny model pretrained on synthetic shell sessions.

A language model an agent is trained from has read a great deal before: among it, terminal sessions in which a
command prints a name and the next command uses it. A randomly initialised tiny model has not, and learning to copy
a name from a tool result into the next call is a sudden emergence that took it anywhere from 100 to more than 400
optimizer steps of SFT on the toy suite, or never within the quickstart's minutes (BENCHMARKS.md, "Quickstart").
So the quickstart starts from this checkpoint instead, which Gyre ships (``assets/tiny-shell.safetensors``, 3.4 MB
in bfloat16) and this module makes again, the same bytes for the same seed, steps and threads:

- the corpus: plain-text shell sessions (`session`): commands of many verbs, prompts and pipes, each reading the
  name the command before it printed (3-4 digits, printed bare or wrapped: ``stdout:``, ``> ``, ``out: ``, ...),
  with interleaved ``echo`` commands and comments. No chat markup and no tool calls: those are SFT's to teach;
- the loss: the mean over the copied names' tokens plus a tenth of the mean over every token (on every token
  alone copying had not emerged after 1,050 steps); AdamW with warm-up and cosine decay;
- the check: the argmax of every copied digit of held-out sessions. A run whose copying did not emerge fails
  rather than writing a checkpoint that would make the quickstart fail later.

Measured (seed 0, 2 threads): copying emerged at ~600 of 1,500 steps of 16 rows of 256 tokens packed with sessions
(0.44 s a step).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gyre.errors import ConfigError, GyreError

ASSET = Path(__file__).parents[1] / "assets" / "tiny-shell.safetensors"
SHIPPED_DIR = Path("models/tiny-shell")
DIGITS = "123456789"
LETTERS = "abcdefghijklmnopqrstuvwxyz"
PROMPTS = ("$ ", "# ", "> ", "user@box:~$ ", "sh-5.2$ ", "")
VERBS = ("cat", "head -1", "tail -n 1", "more", "less", "cat ./", "type", "read", "open", "show")
PIPES = (
    "",
    " | tee -a log",
    " | tee out.txt",
    " 2>&1",
    " | head",
    " > /dev/stdout",
    " | cat",
    " | tee -a notes",
)
FIRST = ("start", "first", "begin", "head", "root")
WRAPS: tuple[Callable[[str], str], ...] = (
    lambda s: s,
    lambda s: f"stdout:\n{s}",
    lambda s: f"exit code: 0\nstdout:\n{s}",
    lambda s: f"> {s}",
    lambda s: f"out: {s}",
    lambda s: f"[{s}]",
    lambda s: f"result = {s}",
)
ALL_TOKENS_WEIGHT = 0.1  # the loss: the mean over copied tokens + this times the mean over every token


def session(rng: random.Random) -> tuple[str, list[tuple[int, int]]]:
    """One shell session as text, and the (offset, length) of each name a command copied from the output before
    it. One character is one token (the tiny model's tokenizer is byte-level; the text is ASCII)."""
    prompt, wrap, gap = rng.choice(PROMPTS), rng.choice(WRAPS), rng.choice(("\n", "\n\n"))

    def name() -> str:
        return "".join(rng.choices(DIGITS, k=rng.randint(3, 4)))

    def word() -> str:
        return "".join(rng.choices(LETTERS, k=rng.randint(1, 8)))

    shown = name()
    text, copies = f"{prompt}cat {rng.choice(FIRST)}\n{wrap(shown)}{gap}", []
    for _ in range(rng.randint(3, 12)):
        if rng.random() < 0.25:  # output with no digits in it
            said = word()
            text += f"{prompt}echo {said}\n{said}{gap}"
        if rng.random() < 0.2:
            text += "# " + " ".join(word() for _ in range(rng.randint(2, 12))) + "\n"
        text += f"{prompt}{rng.choice(VERBS)} "
        copies.append((len(text), len(shown)))
        after = name()
        text += f"{shown}{rng.choice(PIPES)}\n{wrap(after)}{gap}"
        shown = after
    return text, copies


def batch(rng: random.Random, tokenizer: Any, rows: int, length: int) -> tuple[Any, Any]:
    """``rows`` rows of ``length`` tokens packed with sessions (an end-of-text token between two), and a mark for
    each token: 2 on a copied name's first digit, 1 on its other digits, 0 elsewhere."""
    import torch

    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids, marks = [], []
    for _ in range(rows):
        row: list[int] = []
        mark: list[int] = []
        while len(row) < length:
            text, copies = session(rng)
            tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
            here = [0] * len(tokens)
            for at, size in copies:
                here[at] = 2
                here[at + 1 : at + size] = [1] * (size - 1)
            row += [*tokens, eos]
            mark += [*here, 0]
        ids.append(row[:length])
        marks.append(mark[:length])
    return torch.tensor(ids), torch.tensor(marks)


def copy_accuracy(model: Any, ids: Any, marks: Any) -> tuple[float, float]:
    """(first digits, all digits) of the copied names the model's argmax gets right, teacher-forced."""
    import torch

    with torch.no_grad():
        predicted = model(ids).logits.argmax(-1)[:, :-1]
    right = predicted == ids[:, 1:]
    first, every = marks[:, 1:] == 2, marks[:, 1:] > 0
    return float(right[first].float().mean()), float(right[every].float().mean())


def pretrain(directory: str | Path, seed: int = 0, steps: int = 1500, rows: int = 16, length: int = 256,
             learning_rate: float = 3e-3, threads: int = 2, progress: bool = True,
             log: Callable[[str], None] = print) -> dict[str, float]:  # fmt: skip
    """Pretrain a fresh tiny model (``seed``) on shell sessions into ``directory``; return the held-out copy
    accuracy. Raises `GyreError` when copying did not emerge (first-digit accuracy under 0.98)."""
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from gyre.engine.models import init_model, load_tokenizer
    from gyre.train.state import load_model

    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    path = init_model(directory, preset="tiny", seed=seed, overwrite=True)
    tokenizer, model = load_tokenizer(path), load_model(path)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = 50

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / warmup) * (
            0.1 + 0.45 * (1 + math.cos(math.pi * min(step, steps) / steps))
        )

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    rng = random.Random(f"gyre-pretrain/{seed}")
    held_ids, held_marks = batch(random.Random(f"gyre-pretrain-held-out/{seed}"), tokenizer, 32, length)
    started, accuracy = time.monotonic(), (0.0, 0.0)
    with Progress(TextColumn("pretrain"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
                  TimeRemainingColumn(), disable=not progress) as bar:  # fmt: skip
        task = bar.add_task("pretrain", total=steps, status="")
        for step in range(1, steps + 1):
            ids, marks = batch(rng, tokenizer, rows, length)
            logits = model(ids).logits[:, :-1]
            losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
            copied = (marks[:, 1:] > 0).float()
            loss = (losses * copied).sum() / copied.sum() + ALL_TOKENS_WEIGHT * losses.mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            schedule.step()
            if step % 100 == 0 or step == steps:
                model.eval()
                accuracy = copy_accuracy(model, held_ids, held_marks)
                model.train()
                status = f"loss {loss.item():.3f}, copied first digit {accuracy[0]:.3f}, every digit {accuracy[1]:.3f}"
                bar.update(task, status=status)
                if not progress:
                    log(f"step {step}: {status} ({time.monotonic() - started:.0f} s)")
            bar.advance(task)
    if accuracy[0] < 0.98:
        raise GyreError(f"copying did not emerge in {steps} steps (held-out first copied digit {accuracy[0]:.3f}, "
                        "needs 0.98): try more --steps or another --seed")  # fmt: skip
    model.save_pretrained(path, safe_serialization=True)
    return {"first_digit": accuracy[0], "every_digit": accuracy[1], "seconds": time.monotonic() - started}


def export(directory: str | Path, asset: str | Path = ASSET) -> Path:
    """Write ``directory``'s weights as the shipped asset (bfloat16: half the bytes, and what `shipped_model`
    loads back into float32)."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(Path(directory) / "model.safetensors"))
    Path(asset).parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()}, str(asset))
    return Path(asset)


def shipped_model(directory: str | Path = SHIPPED_DIR) -> Path:
    """The shipped pretrained tiny model as a model directory (written from the asset the first time)."""
    import torch
    from safetensors.torch import load_file, save_file

    from gyre.engine.models import init_model

    path = Path(directory)
    if (path / "config.json").exists() and (path / "model.safetensors").exists():
        return path
    if not ASSET.exists():
        raise ConfigError(f"the pretrained tiny model {ASSET} is missing; make it: gyre pretrain --export")
    init_model(path, preset="tiny", overwrite=True)  # the tokenizer and config; its weights are replaced
    weights = {k: v.to(torch.float32).contiguous() for k, v in load_file(str(ASSET)).items()}
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path

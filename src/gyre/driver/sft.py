"""`gyre sft`: a supervised warm start from demonstration call records, written as a Gyre checkpoint.

Demonstrations are `CallRecord`s from run journals (``calls.jsonl``) whose ``source`` is one of
``sft.sources`` (by default ``scripted``: a scripted expert's, e.g. ``gyre eval --agent oracle`` on the toy
suite). A record stores its input as a delta on its parent; a record whose parent was left out (another
source, too long, missing) is left out with it, so every kept call's full input is known. Each optimizer step
takes ``batch_sessions`` sessions and folds them into prefix trees (`gyre.train.prefixtree`) of at most
``micro_step_tokens`` tokens, so the prompt the sessions share, and each session's history, are computed once.
Only output tokens are trained (inputs are context), each weighing ``1 / (trained tokens of the step)``: a
step's loss is the mean negative log-likelihood per demonstrated token, in nats. An output token that several
sessions share under the same context is trained once.

With ``window_tokens`` and ``window_steps`` set, ``window_steps`` steps of a window stage run first. A window is
a piece of a session's conversation that ends at the last token of what it trains: a whole demonstrated output
(``window_focus`` has ``"output"``) or one span of an output copied from the call's latest observation
(``"copied"``: a name, path or value the tool just printed, found as pieces of at least ``window_copy_min``
tokens). Its position ids are the tokens' true positions in the whole conversation, so what it learns carries over
to the long context, and every time it is drawn its start is drawn again, from the start of the latest
observation (for a copied span: where the observation showed it) back to ``window_tokens`` tokens before its end,
so where a window starts tells the model nothing.
A step takes ``window_batch`` windows (reshuffled at each pass over them), left-padded into one batch. Measured on
the tiny model and the ``toy`` suite (BENCHMARKS.md, "Quickstart"): with windows that always started at the same
distance before the copied name the model learnt to copy within ~50 steps and none of it carried over to whole
sessions (it had learnt the offset from the window's start); copying that carries over needed the random starts,
the loss on the copied span alone (on whole outputs the name's 3 tokens drown in ~70 fixed ones) and names of
characters the rest of the conversation does not use. The window stage holds ``learning_rate`` (after warm-up);
``lr_schedule`` decays over the epochs' steps.

Weights, optimizer and checkpoints are `gyre.train.state.TrainState`'s, so ``OUTPUT_DIR/checkpoints/step-N``
is what ``gyre train`` (``run.model_path``), the trainer (``trainer.resume_from``) and ``gyre eval --model-path``
load. The output directory also holds ``config.toml`` (resolved), ``metrics.jsonl`` (a line per step, either stage)
and ``sft.json``.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gyre.config import GyreConfig, LossConfig, SftConfig, dump_config
from gyre.errors import ConfigError
from gyre.journal import Journal, read_journal
from gyre.journal.records import ApiCallRecord, CallRecord, decode_record, input_tails
from gyre.protocol import MicroStats, MicroStep
from gyre.train.prefixtree import TrajectoryTree
from gyre.train.step import Rollout, build_step

if TYPE_CHECKING:
    import torch

    from gyre.train.state import TrainState


class Demonstrations(msgspec.Struct, frozen=True, kw_only=True):
    """Demonstration sessions read from journals, and what was left out and why."""

    journals: list[str]  # the calls.jsonl files read
    sessions: list[list[CallRecord]]  # each session's kept calls in call order (parents first)
    calls: int  # call records kept
    skipped: dict[str, int]  # why -> call records left out


class SftStep(msgspec.Struct, frozen=True, kw_only=True):
    """One line of ``metrics.jsonl``: an applied step."""

    step: int  # 0-based, over both stages
    epoch: int  # the window stage: the pass over the windows
    loss: float  # mean negative log-likelihood per trained token at the step's weights, nats
    entropy: float  # mean entropy of the model's distribution at the trained tokens, nats
    tokens: int  # trained (demonstrated output) tokens
    computed_tokens: int  # tokens through the forward passes (shared prefixes once)
    sessions: int
    micro_steps: int
    grad_norm: float  # before clipping
    lr: float
    seconds: float  # folding, forward, backward and update
    wall_s: float  # since training started
    stage: Literal["window", "full"] = "full"  # window: short windows (see the module); full: whole sessions
    windows: int = 0  # the window stage's windows in the step


class SftSummary(msgspec.Struct, frozen=True, kw_only=True):
    """``sft.json``: the run in a few numbers."""

    output_dir: str
    checkpoint: str  # the last checkpoint: load it as a model directory or resume from it
    model_path: str  # what training started from
    journals: list[str]  # the calls.jsonl files read
    sessions: int  # demonstration sessions
    calls: int  # demonstration calls
    skipped: dict[str, int]  # why -> call records left out
    steps: int  # of the epochs over whole sessions (with no epochs: of the window stage)
    epochs: int
    tokens: int  # trained tokens, summed over the epochs' steps (with no epochs: the window stage's)
    computed_tokens: int
    loss_first: float  # the epochs' first step's loss (on its batch)
    loss_last: float
    epoch_losses: list[float]  # mean loss per trained token of each epoch
    total_s: float  # both stages
    tokens_per_s: float  # computed tokens per second of the epochs' training
    window_steps: int = 0  # steps of the window stage, before the epochs
    window_windows: int = 0  # windows to draw from: one per trained output or copied span
    window_loss_first: float | None = None  # the window stage's first step's loss (the starting model's)
    window_loss_last: float | None = None


def journal_file(path: str | Path) -> Path:
    """The ``calls.jsonl`` that ``path`` names: the file itself, a journal directory or a run directory."""
    path = Path(path)
    for candidate in (path, path / "calls.jsonl", path / "journal" / "calls.jsonl"):
        if candidate.is_file():
            return candidate
    if path.is_dir():
        raise ConfigError(f"{path} holds no calls.jsonl (give a calls.jsonl, a journal or a run directory)")
    raise ConfigError(f"demonstration journal {path} does not exist")


def read_calls(path: Path) -> list[CallRecord]:
    """The call records of one journal file; a torn last line (a crash mid-write) is skipped, any other bad
    line is a `ConfigError` naming it."""
    records: list[CallRecord] = []
    number = 0
    try:
        for number, raw in enumerate(read_journal(path, msgspec.Raw), 1):
            try:
                records.append(decode_record(raw))
            except msgspec.ValidationError as exc:
                raise ConfigError(f"{path}, line {number}: {_not_a_call(raw, exc)}") from None
    except msgspec.DecodeError as exc:  # not JSON, and not the last line
        raise ConfigError(
            f"{path}, line {number + 1} is not a JSON record ({exc}): the journal is damaged"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read: {exc.strerror}") from None
    return records


def _not_a_call(raw: msgspec.Raw, exc: Exception) -> str:
    try:
        msgspec.json.decode(raw, type=ApiCallRecord)
    except msgspec.ValidationError:
        return f"not a call record ({exc})"
    return "an outside model's text-only call (gyre eval --base-url): it has no tokens to train on"


def load_demonstrations(
    journals: Sequence[str | Path], sources: Sequence[str], max_seq_len: int
) -> Demonstrations:
    """The sessions of demonstration calls in ``journals`` (see the module); none is a `ConfigError`."""
    if not journals:
        raise ConfigError("no demonstration journals: set sft.journals (or give --journal PATH)")
    sessions: dict[tuple[int, str], list[CallRecord]] = {}
    skipped: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    files = [journal_file(j) for j in journals]
    for index, path in enumerate(files):
        kept: set[str] = set()
        for record in read_calls(path):
            seen[record.source] += 1
            length = record.prefix_len + len(record.new_input_ids) + len(record.output_ids)
            if record.source not in sources:
                skipped[f"source {record.source}"] += 1
            elif record.parent_call_id is not None and record.parent_call_id not in kept:
                skipped["extends a call left out"] += 1
            elif max_seq_len and length > max_seq_len:
                skipped[f"longer than {max_seq_len} tokens"] += 1
            else:  # call ids are unique per run, not across journals: keep each journal's apart
                kept.add(record.call_id)
                parent = None if record.parent_call_id is None else f"{index}/{record.parent_call_id}"
                renamed = msgspec.structs.replace(
                    record, call_id=f"{index}/{record.call_id}", parent_call_id=parent
                )
                sessions.setdefault((index, record.session), []).append(renamed)
    for key, records in list(sessions.items()):
        if not any(r.output_ids for r in records):
            skipped["a session without output tokens"] += len(sessions.pop(key))
    calls = sum(len(s) for s in sessions.values())
    if not calls:
        found = ", ".join(f"{n} {source}" for source, n in sorted(seen.items())) or "none"
        raise ConfigError(
            f"no demonstrations in {', '.join(map(str, files))}: call records found: {found}; "
            f"accepted sources: {', '.join(sources)} (sft.sources, or --all-sources to train on every record)"
            + (f"; {dict(skipped)} left out" if skipped else "")
        )
    # in a fixed order (journal, session name), not the order executions happened to finish in: the seeded
    # shuffles then draw the same batches from the same demonstrations in every run
    ordered = [sessions[key] for key in sorted(sessions)]
    return Demonstrations(journals=[str(f) for f in files], sessions=ordered, calls=calls,
                          skipped=dict(skipped))  # fmt: skip


def batches(sessions: int, batch_sessions: int, epochs: int, seed: int) -> Iterator[tuple[int, list[int]]]:
    """``(epoch, session indices)`` of each step: every epoch shuffles the sessions (seeded), then batches."""
    for epoch in range(epochs):
        order = list(range(sessions))
        random.Random(f"{seed}/{epoch}").shuffle(order)
        for start in range(0, sessions, batch_sessions):
            yield epoch, order[start : start + batch_sessions]


def fold(sessions: Sequence[list[CallRecord]], token_budget: int) -> list[MicroStep]:
    """One step's micro-steps: the sessions folded into prefix trees of at most ``token_budget`` tokens (a
    longer session gets its own), every output token weighing ``1 / (trained tokens of the step)``."""
    groups: list[list[CallRecord]] = []
    current: list[CallRecord] = []
    for records in sessions:
        if current and TrajectoryTree([*current, *records]).size > token_budget:
            groups.append(current)
            current = []
        current = [*current, *records]
    if current:
        groups.append(current)
    rollouts = [
        Rollout(execution_id=str(i), group=str(i), reward=0.0, records=g) for i, g in enumerate(groups)
    ]
    data = build_step(rollouts, jmax=None, packing="tree", token_budget=token_budget, objective="supervised")
    trained = sum(w > 0 for m in data.micro_steps for w in m.weights)
    return [
        msgspec.structs.replace(m, weights=[1.0 / trained if w > 0 else 0.0 for w in m.weights])
        for m in data.micro_steps
    ]


class Window(msgspec.Struct, frozen=True, kw_only=True):
    """A window-stage example: the tokens of a conversation up to the end of the trained span, at most
    ``window_tokens`` of them; `draw` cuts a shorter one from it at random for each use."""

    session: int  # index of its session
    input_ids: list[int]
    start: int  # the position of input_ids[0] in the whole conversation
    trained: int  # the last ``trained`` tokens are trained (not the first: it has no context)
    # the fewest tokens a drawn window keeps: back to the latest observation's start (a copy: where it was shown)
    least: int = 0

    def draw(self, rng: random.Random) -> Window:
        """This window cut to a random length from ``least`` to all of it: where a window starts tells nothing."""
        keep = rng.randint(min(max(self.least, self.trained + 1), len(self.input_ids)), len(self.input_ids))
        cut = len(self.input_ids) - keep
        return msgspec.structs.replace(self, input_ids=self.input_ids[cut:], start=self.start + cut, least=0)


def copied_spans(output: Sequence[int], observation: Sequence[int], least: int) -> list[tuple[int, int, int]]:
    """``(start, end, source)`` of each run of ``output`` covered by ``least``-token pieces that also occur in
    ``observation`` (what the output copies from what the call was just shown: a name, a path, a value), with
    ``source`` where its first piece last occurs in ``observation``."""
    last: dict[tuple[int, ...], int] = {}
    for i in range(len(observation) - least + 1):
        last[tuple(observation[i : i + least])] = i
    covered = [False] * len(output)
    for i in range(len(output) - least + 1):
        if tuple(output[i : i + least]) in last:
            covered[i : i + least] = [True] * least
    spans, i = [], 0
    while i < len(output):
        if covered[i]:
            j = i
            while j < len(output) and covered[j]:
                j += 1
            spans.append((i, j, last[tuple(output[i : i + least])]))
            i = j
        else:
            i += 1
    return spans


def cut_windows(
    sessions: Sequence[list[CallRecord]],
    window_tokens: int,
    focus: Sequence[Literal["output", "copied"]] = ("output",),
    copy_min: int = 3,
) -> list[Window]:
    """The window-stage examples, in session and call order: for each demonstrated output (``focus`` has "output")
    and each span of it copied from the call's latest observation (``focus`` has "copied", spans of at least
    ``copy_min`` tokens, see `copied_spans`), the last ``window_tokens`` tokens of the conversation up to its
    end, training that output or span. The latest observation is what the call's input adds to its parent's
    input and output (a call with no parent: all its input); a drawn window keeps all of it for an output, from
    where the copied piece was shown for a span, when ``window_tokens`` allows. An output or span with no token to
    train in its window, and a span whose source is more than ``window_tokens`` back, are left out."""
    windows: list[Window] = []
    for index, records in enumerate(sessions):
        # a window never reaches further back than window_tokens: linear in the session, not quadratic
        tails = input_tails(records, window_tokens)
        for r in records:
            offset, tail = tails[r.call_id]
            tokens = tail + r.output_ids  # the conversation's last tokens; tokens[0] is at position ``first``
            first = offset - len(tail)
            seen = r.prefix_len if r.parent_call_id is not None else 0
            spans = [(0, len(r.output_ids), 0)] if "output" in focus else []
            if "copied" in focus:
                spans += copied_spans(r.output_ids, r.new_input_ids, copy_min)
            for k, (a, b, source) in enumerate(spans):
                end = offset + b
                start = max(end - window_tokens, 0)
                trained = min(b - a, end - start - 1)
                copy = k > 0 or "output" not in focus
                if copy and end - seen - source > window_tokens:
                    continue  # a copy whose source the window cannot hold: nothing to copy it from
                if trained > 0:
                    windows.append(Window(session=index, input_ids=tokens[start - first : end - first], start=start,
                                          trained=trained, least=end - seen - source))  # fmt: skip
    return windows


def window_batches(windows: int, batch: int, steps: int, seed: int) -> Iterator[tuple[int, list[int]]]:
    """``(pass, window indices)`` of each window-stage step: every pass over the windows reshuffles them (seeded),
    and steps take ``batch`` at a time (a step may run into the next pass; its pass is its first window's)."""
    order: list[int] = []
    drawn = passes = 0
    for _ in range(steps):
        while len(order) < batch:
            more = list(range(windows))
            random.Random(f"{seed}/window/{passes}").shuffle(more)
            order += more
            passes += 1
        yield drawn // windows, order[:batch]
        order, drawn = order[batch:], drawn + batch


def pad_windows(
    windows: Sequence[Window], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, position_ids, trained)``, each ``[windows, longest]``: the windows left-padded
    with ``pad_id`` (mask 0, position 0), positions their true ones, ``trained`` True at the output's tokens."""
    import torch

    width = max(len(w.input_ids) for w in windows)
    ids = torch.full((len(windows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(windows), width), dtype=torch.long)
    positions = torch.zeros((len(windows), width), dtype=torch.long)
    trained = torch.zeros((len(windows), width), dtype=torch.bool)
    for row, w in enumerate(windows):
        pad = width - len(w.input_ids)
        ids[row, pad:] = torch.tensor(w.input_ids)
        mask[row, pad:] = 1
        positions[row, pad:] = torch.arange(w.start, w.start + len(w.input_ids))
        trained[row, width - w.trained :] = True
    return ids, mask, positions, trained


def window_gradients(model: Any, windows: Sequence[Window], pad_id: int) -> MicroStats:
    """Forward and backward of one window step (one batch) into ``model``'s ``.grad``: the mean over windows of
    each window's mean NLL per trained token; returns its figures."""
    import torch

    started = time.perf_counter()
    ids, mask, positions, trained = pad_windows(windows, pad_id)
    device = next(model.parameters()).device
    ids, mask, positions, trained = (t.to(device) for t in (ids, mask, positions, trained))
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    logprobs = logits[:, :-1].float().log_softmax(-1)  # position i predicts token i + 1
    picked = logprobs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    target = trained[:, 1:]
    tokens = int(target.sum())
    per_window = (picked * target).sum(-1) / target.sum(-1).clamp(min=1)  # each window's mean NLL
    loss = -per_window.mean()  # every window weighs the same: a 3-token copied name as much as a whole output
    loss.backward()
    with torch.no_grad():
        entropy = -(logprobs.exp() * logprobs).sum(-1)[target].double().sum()
    return MicroStats(loss=float(loss.detach()), tokens=tokens, computed_tokens=int(mask.sum()),
                      entropy_sum=float(entropy), seconds=time.perf_counter() - started)  # fmt: skip


def context_limit(model_path: str) -> int:
    """The model's ``max_position_embeddings`` (0 when its config does not say)."""
    path = Path(model_path) / "config.json"
    if not path.is_file():
        raise ConfigError(
            f"sft.model_path {model_path} is not a Hugging Face model directory (no config.json)"
        )
    return int(json.loads(path.read_text()).get("max_position_embeddings") or 0)


def run_sft(cfg: GyreConfig, progress: bool = False) -> SftSummary:
    """Train ``cfg.sft`` (see the module) and fill the output directory; ``progress``: a rich progress bar."""
    import torch

    from gyre.train.objective import compute_gradients, merge_stats

    sft = cfg.sft
    out = Path(sft.output_dir or Path("runs") / f"sft-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(
            f"output directory {out} is not empty; choose another (sft.output_dir, --output-dir)"
        )
    if sft.epochs == 0 and sft.window_steps == 0:
        raise ConfigError(
            "sft.epochs = 0 and no window stage: nothing to train; set sft.epochs or sft.window_steps"
        )
    if (sft.window_tokens > 0) != (sft.window_steps > 0) or sft.window_tokens == 1:
        raise ConfigError(
            f"sft.window_tokens = {sft.window_tokens}, sft.window_steps = {sft.window_steps}: "
            "set both (window_tokens at least 2) for a window stage, or neither"
        )
    demos = load_demonstrations(sft.journals, sft.sources, sft.max_seq_len or context_limit(sft.model_path))
    windows = (
        cut_windows(demos.sessions, sft.window_tokens, sft.window_focus, sft.window_copy_min)
        if sft.window_steps
        else []
    )
    if sft.window_steps and not windows:
        raise ConfigError(
            f"no demonstrated output (window_focus {sft.window_focus}) has a token to train in a window: "
            "raise sft.window_tokens"
        )
    window_plan = list(window_batches(len(windows), sft.window_batch, sft.window_steps, sft.seed))
    plan = list(batches(len(demos.sessions), sft.batch_sessions, sft.epochs, sft.seed))
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    torch.manual_seed(sft.seed)
    state = _staged_state(cfg, len(window_plan), len(plan))
    pad_id = state.model.config.pad_token_id or 0  # masked out: any id will do
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.toml").write_text(dump_config(cfg))
    metrics, started = Journal(out, "metrics.jsonl"), time.monotonic()
    rng = random.Random(f"{sft.seed}/window-lengths")
    steps: list[SftStep] = []
    loss = LossConfig()  # plain NLL: no KL, coefficient 1
    with _progress(progress) as bar:
        task = bar.add_task("sft", total=len(window_plan) + len(plan), status="")
        stages: list[tuple[Literal["window", "full"], int, list[int]]] = [
            *(("window", e, c) for e, c in window_plan),
            *(("full", e, c) for e, c in plan),
        ]
        for stage, epoch, chosen in stages:
            t0 = time.monotonic()
            if stage == "window":
                batch = [windows[i].draw(rng) for i in chosen]
                s = window_gradients(state.model, batch, pad_id)
                sessions, micro, drawn = len({w.session for w in batch}), 1, len(batch)
                where = f"windows, pass {epoch + 1}"
            else:
                micro_steps = fold([demos.sessions[i] for i in chosen], sft.micro_step_tokens)
                s = merge_stats([compute_gradients(state.model, m, loss, state.version) for m in micro_steps])
                sessions, micro, drawn = len(chosen), len(micro_steps), 0
                where = f"epoch {epoch + 1}/{sft.epochs}"
            state.add_model_gradients()
            grad_norm, lr = state.apply()
            now = time.monotonic()
            step = SftStep(step=state.step - 1, epoch=epoch, loss=s.loss, tokens=s.tokens,
                           entropy=s.entropy_sum / max(s.tokens, 1), computed_tokens=s.computed_tokens,
                           sessions=sessions, micro_steps=micro, grad_norm=grad_norm, lr=lr, seconds=now - t0,
                           wall_s=now - started, stage=stage, windows=drawn)  # fmt: skip
            metrics.append(step)
            steps.append(step)
            if sft.checkpoint_every_steps and state.step % sft.checkpoint_every_steps == 0:
                state.save(out / "checkpoints" / f"step-{state.step}")
            bar.update(task, advance=1, status=f"{where}  loss {step.loss:.3f}  "
                       f"{step.computed_tokens / max(step.seconds, 1e-9):,.0f} tokens/s")  # fmt: skip
    metrics.close()
    checkpoint = state.save(out / "checkpoints" / f"step-{state.step}")
    summary = _summary(sft, out, checkpoint, demos, len(windows), steps, time.monotonic() - started)
    (out / "sft.json").write_bytes(msgspec.json.format(msgspec.json.encode(summary)))
    return summary


def _staged_state(cfg: GyreConfig, window_steps: int, full_steps: int) -> TrainState:
    """A `TrainState` of ``[trainer]`` with ``[sft]``'s model and learning rate: warm-up from the first step,
    ``learning_rate`` held through the window stage, then ``lr_schedule`` decaying over the epochs' steps."""
    from gyre.train.state import TrainState

    sft = cfg.sft
    shift = max(window_steps - sft.lr_warmup_steps, 0)  # window steps after warm-up: the schedule waits

    class StagedState(TrainState):
        def lr_at(self, step: int) -> float:
            if sft.lr_warmup_steps <= step < window_steps:
                return sft.learning_rate
            return super().lr_at(step if step < sft.lr_warmup_steps else step - shift)

    return StagedState(msgspec.structs.replace(
        cfg.trainer, model_path=sft.model_path, resume_from="", learning_rate=sft.learning_rate,
        lr_schedule=sft.lr_schedule, lr_warmup_steps=sft.lr_warmup_steps,
        lr_decay_steps=max(window_steps + full_steps - shift - sft.lr_warmup_steps, 0), seed=sft.seed,
        loss=LossConfig(),
    ))  # fmt: skip


def _summary(
    sft: SftConfig,
    out: Path,
    checkpoint: Path,
    demos: Demonstrations,
    windows: int,
    every: list[SftStep],
    total_s: float,
) -> SftSummary:
    window = [s for s in every if s.stage == "window"]
    steps = [s for s in every if s.stage == "full"]
    epoch_losses = []
    for epoch in range(sft.epochs):
        these = [s for s in steps if s.epoch == epoch]
        epoch_losses.append(sum(s.loss * s.tokens for s in these) / max(sum(s.tokens for s in these), 1))
    if not steps:  # a window stage alone: its figures
        steps = window
    computed = sum(s.computed_tokens for s in steps)
    return SftSummary(
        output_dir=str(out), checkpoint=str(checkpoint), model_path=sft.model_path, journals=demos.journals,
        sessions=len(demos.sessions), calls=demos.calls, skipped=demos.skipped, steps=len(steps),
        epochs=sft.epochs, tokens=sum(s.tokens for s in steps), computed_tokens=computed,
        loss_first=steps[0].loss, loss_last=steps[-1].loss, epoch_losses=epoch_losses, total_s=total_s,
        tokens_per_s=computed / max(sum(s.seconds for s in steps), 1e-9), window_steps=len(window),
        window_windows=windows, window_loss_first=window[0].loss if window else None,
        window_loss_last=window[-1].loss if window else None,
    )  # fmt: skip


def _progress(show: bool) -> Progress:
    return Progress(TextColumn("[bold]sft"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[status]}"), disable=not show)  # fmt: skip

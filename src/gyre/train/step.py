"""From a step's finished executions to micro-steps: advantages, `Jmax` selection, loss weights, packing.

- Advantages are group-relative over the executions of one task in the step (mean and std normalisation, or mean
  only). Dropped executions leave their group; placeholders (reward 0) stay in it.
- Loss weights are fixed at admission: every selected trainable token of execution e weighs
  ``1 / (T_e * E)``, with ``T_e`` its selected trainable tokens (each counted once however many paths share it) and
  ``E`` the step's executions that have any. The weights of a step sum to 1, an execution's total is ``1 / E`` however
  many branches it has, and the sum of micro-step gradients is the full-batch gradient whoever computes which.
- Packing, two ways feeding the same loss: ``path`` (each selected path one sequence; a token an earlier path of
  the execution already trains weighs 0 there) and ``tree`` (an execution's selected paths as one sequence: each
  token attends to its ancestors only, position ids are depths, so a shared prefix is computed once). Sequences are
  packed first-fit-decreasing into micro-steps of at most ``token_budget`` tokens (a longer one gets its own).
- Zero advantage (``skip_zero_advantage``): an execution whose advantage is exactly 0 (its group scored alike, the
  GRPO groups DAPO filters) adds nothing to the clipped surrogate's gradient, so it is not computed at all when the
  loss has no other term for it (no KL to a reference). It still counts in ``E``: the other executions' weights,
  and so the step's gradient, are what they would have been. Early in a binary-reward run most groups score alike,
  late many pass whole: the training a step costs follows the solve rate (`gyre sim`'s ``solve_rate_*``).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

import msgspec

from gyre.config import TrajectoryConfig
from gyre.journal.records import CallRecord
from gyre.protocol import MicroStep, Objective
from gyre.train.prefixtree import Node, TrajectoryTree, select_paths

Packing = Literal["tree", "path"]
Normalization = Literal["mean_std", "mean"]


class Rollout(msgspec.Struct, frozen=True, kw_only=True):
    """What training needs of one finished execution."""

    execution_id: str
    group: str  # executions of the same task in a step form a group (the task id)
    reward: float
    records: list[CallRecord]
    dropped: bool = False  # the verifier failed: it leaves its group and is not trained
    why: str = ""  # why it was dropped


class StepData(msgspec.Struct, frozen=True, kw_only=True):
    """A step's micro-steps and what it took to make them."""

    micro_steps: list[MicroStep]
    advantages: dict[str, float]  # execution id -> advantage
    paths: dict[str, int]  # execution id -> selected paths
    trainable_tokens: int  # weighted tokens of the step (each counted once)
    computed_tokens: int  # tokens the forward passes will process
    executions: int  # executions carrying loss weight (E)
    skipped: int = 0  # of them, those not computed: advantage 0, no other loss term (skip_zero_advantage)


def group_advantages(
    rollouts: Sequence[Rollout], normalization: Normalization = "mean_std"
) -> dict[str, float]:
    """Reward minus its group's mean (divided by the group's std for ``mean_std``); dropped executions excluded."""
    groups: dict[str, list[Rollout]] = defaultdict(list)
    for r in rollouts:
        if not r.dropped:
            groups[r.group].append(r)
    out: dict[str, float] = {}
    for members in groups.values():
        rewards = [r.reward for r in members]
        if max(rewards) == min(rewards):  # scored alike: exactly 0, whatever the mean's rounding
            out |= {r.execution_id: 0.0 for r in members}
            continue
        mean = statistics.fmean(rewards)
        std = statistics.pstdev(rewards) if len(rewards) > 1 else 0.0
        for r in members:
            centred = r.reward - mean
            out[r.execution_id] = centred / (std + 1e-6) if normalization == "mean_std" else centred
    return out


def build_step_from_config(
    rollouts: Sequence[Rollout], cfg: TrajectoryConfig, step: int = 0, objective: Objective = "policy",
    kl_coef: float = 0.0,
) -> StepData:  # fmt: skip
    """`build_step` with a run's ``[trajectory]`` settings; ``step`` varies the selection seed between steps;
    ``kl_coef`` the loss's (a KL term trains zero-advantage executions too, so they are computed then)."""
    return build_step(
        rollouts,
        objective=objective,
        jmax=cfg.jmax or None,
        packing=cfg.packing,
        token_budget=cfg.micro_step_tokens,
        seed=cfg.seed * 1_000_003 + step,
        normalization=cfg.advantage,
        skip_zero_advantage=cfg.skip_zero_advantage and kl_coef == 0,
    )


def build_step(
    rollouts: Sequence[Rollout],
    *,
    jmax: int | None = 5,
    packing: Packing = "tree",
    token_budget: int = 8192,
    seed: int = 0,
    normalization: Normalization = "mean_std",
    objective: Objective = "policy",
    skip_zero_advantage: bool = False,
) -> StepData:
    """The micro-steps of one optimizer step over ``rollouts`` (see the module); seeded and reproducible.

    ``objective="policy"`` refuses (ValueError) any record the policy did not sample (a scripted expert's
    demonstration): its logprobs and version are not a behaviour policy's. ``"supervised"`` trains every output
    token of every record with the negative log-likelihood (advantages are unused). ``skip_zero_advantage``: the
    policy objective computes no sequence for an execution whose advantage is 0 (see the module; only exact
    without a KL term, which the caller knows).
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be positive, not {token_budget}")
    if objective == "policy":
        for r in rollouts:
            for record in r.records:
                if record.source != "policy":
                    raise ValueError(
                        f"execution {r.execution_id}: call {record.call_id} is a {record.source} record, not "
                        "sampled by the policy; the policy-gradient loss trains only sampled tokens (train "
                        "demonstrations with objective='supervised')"
                    )
    advantages = group_advantages(rollouts, normalization)
    chosen: list[tuple[Rollout, TrajectoryTree, list[Node], int]] = []
    for r in rollouts:
        if r.dropped or not r.records:
            continue
        tree = TrajectoryTree(r.records)
        leaves = select_paths(tree, jmax, random.Random(f"{seed}/{r.execution_id}"))
        covered = _union(leaves)
        tokens = sum(n.trainable for n in covered)
        if tokens:
            chosen.append((r, tree, leaves, tokens))
    executions = len(chosen)
    skip = skip_zero_advantage and objective == "policy"
    computed = [c for c in chosen if not (skip and advantages[c[0].execution_id] == 0.0)]
    sequences: list[_Sequence] = []
    for r, _tree, leaves, tokens in computed:
        weight = 1.0 / (tokens * executions)  # E counts the skipped too: the gradient is the whole step's
        advantage = advantages[r.execution_id]
        if packing == "tree":
            sequences.append(_tree_sequence(_union(leaves), weight, advantage))
        else:
            trained: set[int] = set()
            for leaf in leaves:
                sequences.append(_path_sequence(leaf.path(), trained, weight, advantage))
    micro_steps = [_pack(group, objective) for group in _first_fit(sequences, token_budget)]
    return StepData(
        micro_steps=micro_steps,
        advantages=advantages,
        paths={r.execution_id: len(leaves) for r, _, leaves, _ in computed},
        trainable_tokens=sum(t for *_, t in computed),
        computed_tokens=sum(len(s.ids) for s in sequences),
        executions=executions,
        skipped=executions - len(computed),
    )


class _Sequence:
    """One sequence before packing: parents are local indices."""

    __slots__ = ("advantages", "ids", "logprobs", "parents", "positions", "versions", "weights")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.positions: list[int] = []
        self.parents: list[int] = []
        self.weights: list[float] = []
        self.advantages: list[float] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []

    def extend(self, node: Node, parent: int, weigh: bool, weight: float, advantage: float) -> int:
        """Append ``node``'s tokens after local index ``parent``; returns the index of its last token."""
        start = len(self.ids)
        self.ids += node.tokens
        self.positions += range(node.depth, node.depth + len(node.tokens))
        self.parents += [parent, *range(start, start + len(node.tokens) - 1)]
        self.weights += [weight if weigh and s else 0.0 for s in node.sampled]
        self.advantages += [advantage] * len(node.tokens)
        self.logprobs += node.logprobs
        self.versions += node.versions
        return len(self.ids) - 1


def _union(leaves: list[Node]) -> list[Node]:
    """The nodes on the paths to ``leaves``, each once, depth-first: parents before children, subtrees contiguous."""
    selected = {id(node) for leaf in leaves for node in leaf.path()}
    roots = {id(leaf.path()[0]): leaf.path()[0] for leaf in leaves}
    nodes: list[Node] = []
    stack = list(roots.values())[::-1]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(child for child in reversed(node.children.values()) if id(child) in selected)
    return nodes


def _tree_sequence(nodes: list[Node], weight: float, advantage: float) -> _Sequence:
    seq = _Sequence()
    last: dict[int, int] = {}  # node id -> local index of its last token
    for node in nodes:  # parents come before children in `_union`'s order
        parent = last[id(node.parent)] if node.parent is not None and id(node.parent) in last else -1
        last[id(node)] = seq.extend(node, parent, True, weight, advantage)
    return seq


def _path_sequence(path: list[Node], trained: set[int], weight: float, advantage: float) -> _Sequence:
    seq = _Sequence()
    parent = -1
    for node in path:
        parent = seq.extend(node, parent, id(node) not in trained, weight, advantage)
        trained.add(id(node))
    return seq


def _first_fit(sequences: list[_Sequence], budget: int) -> list[list[_Sequence]]:
    bins: list[list[_Sequence]] = []
    room: list[int] = []
    for seq in sorted(sequences, key=lambda s: -len(s.ids)):
        for i, free in enumerate(room):
            if len(seq.ids) <= free:
                bins[i].append(seq)
                room[i] -= len(seq.ids)
                break
        else:
            bins.append([seq])
            room.append(max(budget - len(seq.ids), 0))
    return bins


def _pack(group: list[_Sequence], objective: Objective) -> MicroStep:
    ids: list[int] = []
    positions: list[int] = []
    parents: list[int] = []
    weights: list[float] = []
    advantages: list[float] = []
    logprobs: list[float] = []
    versions: list[int] = []
    for seq in group:
        offset = len(ids)
        ids += seq.ids
        positions += seq.positions
        parents += [p + offset if p >= 0 else -1 for p in seq.parents]
        weights += seq.weights
        advantages += seq.advantages
        logprobs += seq.logprobs
        versions += seq.versions
    assert all(math.isfinite(w) for w in weights)
    return MicroStep(input_ids=ids, position_ids=positions, parents=parents, weights=weights,
                     advantages=advantages, behaviour_logprobs=logprobs, versions=versions,
                     sequences=len(group), objective=objective)  # fmt: skip

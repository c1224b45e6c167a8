"""Random agent-shaped executions through the trajectory tree, `Jmax` selection and step building, checked against
the full token sequences the generator keeps.

An execution is a shared system prompt, a main conversation whose calls extend the previous one token-exactly,
compactions (a ``main-summary`` call, then a fresh ``main`` branch), sub-agents with their own turns and summaries,
and retries that re-send an earlier input as a new branch. The vocabulary is small and outputs often echo what an
earlier call has at the same prefix, so context and sampled tokens run along each other.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.journal.records import ROLE_PRIORITY, CallRecord, CallTiming, Role, expand_inputs
from gyre.train.prefixtree import Node, TrajectoryTree, select_paths
from gyre.train.step import MicroStep, Normalization, Packing, Rollout, build_step, group_advantages

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VOCAB = st.integers(0, 40)
MARKER = 100  # first token of execution e's system prompt is MARKER + e: a packed token names its execution
RANK = {role: i for i, role in enumerate(ROLE_PRIORITY)}

Prefix = tuple[int, ...]


def _logprob(call: int, j: int) -> float:
    """Distinct per call and output position, so a tree token's logprob names where it was sampled."""
    return -(call + 1) / 100 - j / 10_000


@dataclass
class Execution:
    """Records of one execution plus the ground truth: every call's full input ids."""

    system: list[int]
    version: int
    records: list[CallRecord] = field(default_factory=list)
    inputs: list[list[int]] = field(default_factory=list)

    def seq(self, call: int) -> list[int]:
        return self.inputs[call] + self.records[call].output_ids

    def call(self, role: Role, parent: int | None, new_input: list[int], output: list[int]) -> int:
        index = len(self.records)
        prefix = [] if parent is None else self.seq(parent)
        self.records.append(
            CallRecord(
                call_id=f"c{index}",
                session="s0",
                role=role,
                parent_call_id=None if parent is None else f"c{parent}",
                prefix_len=len(prefix),
                new_input_ids=new_input,
                output_ids=output,
                output_logprobs=[_logprob(index, j) for j in range(len(output))],
                finish_reason="stop",
                weight_version=self.version,
                cell="engine-0",
                timing=CallTiming(submitted_s=0.0, first_token_s=None, finished_s=0.0),
            )
        )
        self.inputs.append(prefix + new_input)
        return index

    # ---- ground truth ---------------------------------------------------------------------------------------
    def prefixes(self) -> set[Prefix]:
        """Every distinct non-empty prefix of every call's input + output."""
        return {
            tuple(s[:n])
            for i in range(len(self.records))
            for s in [self.seq(i)]
            for n in range(1, len(s) + 1)
        }

    def sampled(self) -> dict[Prefix, set[float]]:
        """Prefix -> the behaviour logprobs of the calls whose output produced its last token."""
        out: dict[Prefix, set[float]] = {}
        for i, record in enumerate(self.records):
            s, n_in = self.seq(i), len(self.inputs[i])
            for j, logprob in enumerate(record.output_logprobs):
                out.setdefault(tuple(s[: n_in + j + 1]), set()).add(logprob)
        return out

    def maximal(self) -> set[Prefix]:
        """Full sequences that are no proper prefix of another call's: the tree's leaves."""
        seqs = {tuple(self.seq(i)) for i in range(len(self.records))}
        proper = {p[:n] for p in seqs for n in range(len(p))}
        return seqs - proper


@st.composite
def _tokens(draw: st.DrawFn, lo: int, hi: int) -> list[int]:
    return draw(st.lists(VOCAB, min_size=lo, max_size=hi))


def _output(draw: st.DrawFn, ex: Execution, full_input: list[int]) -> list[int]:
    """Random tokens, often starting with what an earlier sequence has after the same input."""
    n = len(full_input)
    later = [s for i in range(len(ex.records)) for s in [ex.seq(i)] if len(s) > n and s[:n] == full_input]
    echo: list[int] = []
    if draw(st.booleans()) and later:
        earlier = draw(st.sampled_from(later))
        echo = earlier[n : n + draw(st.integers(1, 4))]
    return echo + draw(_tokens(0, 4))


@st.composite
def executions(draw: st.DrawFn, index: int = 0) -> Execution:
    """One agent-shaped execution (see the module)."""
    ex = Execution(system=[MARKER + index, *draw(_tokens(1, 4))], version=index)
    instruction = draw(_tokens(1, 4))
    main: int | None = None  # the main conversation's latest call
    subs: list[int] = []  # open sub-agents' latest calls

    def new_branch(role: Role, new_input: list[int]) -> int:
        return ex.call(role, None, new_input, _output(draw, ex, new_input))

    def extend(role: Role, parent: int, new_input: list[int]) -> int:
        return ex.call(role, parent, new_input, _output(draw, ex, ex.seq(parent) + new_input))

    actions = ["main", "main", "main", "compact", "sub", "sub-turn", "sub-summary", "retry"]
    for action in draw(st.lists(st.sampled_from(actions), min_size=1, max_size=14)):
        if action == "main" or (main is None and action == "compact"):
            if main is None:
                main = new_branch("main", ex.system + instruction)
            else:
                main = extend("main", main, draw(_tokens(0, 4)))  # the tool's output
        elif action == "compact":
            assert main is not None
            summary = extend("main-summary", main, draw(_tokens(1, 3)))
            main = new_branch("main", ex.system + instruction + ex.records[summary].output_ids)
        elif action == "sub" or (not subs and action in ("sub-turn", "sub-summary")):
            # a sub-agent's task may start like the main one
            shared = instruction[: draw(st.integers(0, len(instruction)))]
            subs.append(new_branch("sub-agent", ex.system + shared + draw(_tokens(0, 3))))
        elif action == "sub-turn":
            k = draw(st.integers(0, len(subs) - 1))
            subs[k] = extend("sub-agent", subs[k], draw(_tokens(0, 3)))
        elif action == "sub-summary":
            k = draw(st.integers(0, len(subs) - 1))
            extend("sub-agent-summary", subs.pop(k), draw(_tokens(1, 2)))
        else:  # retry: an earlier input, identical, as a new branch; the harness may continue from it
            if not ex.records:
                continue
            old = draw(st.just(len(ex.records) - 1) | st.integers(0, len(ex.records) - 1))  # often the latest
            # usually the same role; sometimes the same tokens come from another role (leaves then hold several)
            role = ex.records[old].role if draw(st.booleans()) else draw(st.sampled_from(ROLE_PRIORITY))
            output = (
                list(ex.records[old].output_ids) if draw(st.booleans()) else None
            )  # sampled the same again
            retry = ex.call(role, None, list(ex.inputs[old]), output or _output(draw, ex, ex.inputs[old]))
            if draw(st.booleans()):
                if main == old:
                    main = retry
                subs = [retry if s == old else s for s in subs]
    return ex


@dataclass
class Step:
    rollouts: list[Rollout]
    truth: dict[str, Execution]  # execution id -> its ground truth (placeholders have none)


@st.composite
def steps(draw: st.DrawFn) -> Step:
    """A few groups of executions; some dropped by the verifier, some placeholders with nothing recorded."""
    rollouts: list[Rollout] = []
    truth: dict[str, Execution] = {}
    index = 0
    for g in range(draw(st.integers(1, 3))):
        for _ in range(draw(st.integers(1, 4))):
            kind = draw(st.sampled_from(["run", "run", "run", "run", "dropped", "placeholder"]))
            eid = f"e{index}"
            reward = draw(st.sampled_from([0.0, 0.25, 1.0]))
            if kind == "placeholder":
                rollouts.append(Rollout(execution_id=eid, group=f"g{g}", reward=0.0, records=[]))
            else:
                ex = draw(executions(index))
                truth[eid] = ex
                rollouts.append(
                    Rollout(
                        execution_id=eid,
                        group=f"g{g}",
                        reward=reward,
                        records=ex.records,
                        dropped=kind == "dropped",
                    )
                )
            index += 1
    return Step(rollouts, truth)


# ---- reading the tree and the micro-steps back ------------------------------------------------------------------
def _tokens_to(node: Node) -> list[int]:
    return [t for n in node.path() for t in n.tokens]


def _prefixes(micro: MicroStep) -> list[Prefix]:
    """Each token's ancestor chain, root first, ending with the token itself."""
    out: list[Prefix] = []
    for i, (token, parent) in enumerate(zip(micro.input_ids, micro.parents, strict=True)):
        assert -1 <= parent < i
        out.append((*out[parent], token) if parent >= 0 else (token,))
    return out


def _weighted(micro_steps: list[MicroStep]) -> list[tuple[Prefix, float, float, float, int]]:
    """(prefix, weight, advantage, behaviour logprob, version) of every token with a positive weight."""
    return [
        (prefix, m.weights[i], m.advantages[i], m.behaviour_logprobs[i], m.versions[i])
        for m in micro_steps
        for i, prefix in enumerate(_prefixes(m))
        if m.weights[i] > 0
    ]


def _execution_of(prefix: Prefix) -> str:
    return f"e{prefix[0] - MARKER}"


def _trainable(step: Step) -> dict[str, set[Prefix]]:
    """Execution id -> its sampled prefixes, for the executions that are trained (not dropped)."""
    dropped = {r.execution_id for r in step.rollouts if r.dropped}
    return {eid: set(ex.sampled()) for eid, ex in step.truth.items() if eid not in dropped}


# ---- 1. the tree is the set of distinct prefixes ----------------------------------------------------------------
@PROPERTY
@given(executions())
def test_tree_holds_exactly_the_distinct_prefixes(ex: Execution) -> None:
    # the generator's deltas expand to its full inputs
    assert expand_inputs(ex.records) == {f"c{i}": full for i, full in enumerate(ex.inputs)}
    tree = TrajectoryTree(ex.records)
    ends = []
    for node in tree.nodes():
        assert node.depth == len(_tokens_to(node)) - len(node.tokens)
        for call in node.ends:
            assert _tokens_to(node) == ex.seq(call)
            ends.append(call)
    assert sorted(ends) == list(range(len(ex.records)))  # every call ends at exactly one node
    stored = [tuple(_tokens_to(n)[: n.depth + j + 1]) for n in tree.nodes() for j in range(len(n.tokens))]
    assert len(stored) == len(set(stored)) == tree.size
    assert set(stored) == ex.prefixes()
    assert {tuple(_tokens_to(leaf)) for leaf in tree.leaves()} == ex.maximal()
    assert len(tree.leaves()) == len(ex.maximal())


# ---- 2. trainable = sampled -------------------------------------------------------------------------------------
@PROPERTY
@given(executions())
def test_a_token_is_trainable_iff_some_call_sampled_it(ex: Execution) -> None:
    tree = TrajectoryTree(ex.records)
    sampled = ex.sampled()
    for node in tree.nodes():
        path = _tokens_to(node)
        for j in range(len(node.tokens)):
            logprobs = sampled.get(tuple(path[: node.depth + j + 1]))
            assert node.sampled[j] == (logprobs is not None)
            if logprobs is not None:
                assert node.logprobs[j] in logprobs
                assert node.versions[j] == ex.version
            else:
                assert (node.logprobs[j], node.versions[j]) == (0.0, -1)
    assert tree.trainable == len(sampled)


# ---- 3. every trainable token is weighted once ------------------------------------------------------------------
@PROPERTY
@pytest.mark.parametrize("packing", ["tree", "path"])
@given(step=steps(), seed=st.integers(0, 3))
def test_uncapped_every_trainable_token_is_weighted_exactly_once(
    packing: Packing, step: Step, seed: int
) -> None:
    data = build_step(step.rollouts, jmax=None, packing=packing, seed=seed)
    weighted = _weighted(data.micro_steps)
    counts = Counter((_execution_of(p), p) for p, *_ in weighted)
    assert max(counts.values(), default=1) == 1
    expected = {(eid, p) for eid, prefixes in _trainable(step).items() for p in prefixes}
    assert set(counts) == expected
    assert data.trainable_tokens == len(expected)
    sampled = {eid: ex.sampled() for eid, ex in step.truth.items()}
    for prefix, _w, advantage, logprob, version in weighted:
        eid = _execution_of(prefix)
        assert advantage == data.advantages[eid]
        assert version == step.truth[eid].version
        assert logprob in sampled[eid][prefix]


@PROPERTY
@given(step=steps(), jmax=st.integers(1, 4), seed=st.integers(0, 3))
def test_capped_selection_weighs_only_trainable_tokens_and_packings_agree(
    step: Step, jmax: int, seed: int
) -> None:
    trainable = _trainable(step)
    by_packing = {}
    packing: Packing
    for packing in ("tree", "path"):
        data = build_step(step.rollouts, jmax=jmax, packing=packing, seed=seed)
        assert build_step(step.rollouts, jmax=jmax, packing=packing, seed=seed) == data  # reproducible
        assert all(1 <= n <= jmax for n in data.paths.values())
        weighted = _weighted(data.micro_steps)
        counts = Counter(p for p, *_ in weighted)
        assert max(counts.values(), default=1) == 1
        assert all(p in trainable.get(_execution_of(p), set()) for p in counts)
        roots = Counter(_execution_of(p) for m in data.micro_steps for p in _prefixes(m) if len(p) == 1)
        if packing == "path":
            assert roots == Counter(data.paths)  # one sequence per selected path
        else:
            assert set(roots.values()) <= {1}  # one sequence per execution: all calls share the system prompt
        by_packing[packing] = sorted(weighted)
    assert by_packing["tree"] == by_packing["path"]  # the same loss, however packed


# ---- 4. weights -------------------------------------------------------------------------------------------------
@PROPERTY
@given(step=steps(), jmax=st.none() | st.integers(1, 4), packing=st.sampled_from(["tree", "path"]))
def test_weights_sum_to_one_and_each_execution_to_one_over_e(
    step: Step, jmax: int | None, packing: Packing
) -> None:
    data = build_step(step.rollouts, jmax=jmax, packing=packing)
    trained = {eid for eid, prefixes in _trainable(step).items() if prefixes}
    assert data.executions == len(trained)
    per_execution: dict[str, float] = {}
    tokens = Counter[str]()
    for prefix, weight, *_ in _weighted(data.micro_steps):
        eid = _execution_of(prefix)
        per_execution[eid] = per_execution.get(eid, 0.0) + weight
        tokens[eid] += 1
    assert set(per_execution) == trained  # dropped executions and placeholders carry no weight
    for total in per_execution.values():  # however many branches the execution has
        assert math.isclose(total, 1 / len(trained), abs_tol=1e-9)
    for micro in data.micro_steps:
        for prefix, weight in zip(_prefixes(micro), micro.weights, strict=True):
            if weight > 0:
                eid = _execution_of(prefix)
                assert math.isclose(weight, 1 / (tokens[eid] * len(trained)), rel_tol=1e-12)
    total = sum(w for m in data.micro_steps for w in m.weights)
    assert math.isclose(total, 1.0 if trained else 0.0, abs_tol=1e-9)
    placeholders = {r.execution_id for r in step.rollouts if not r.records and not r.dropped}
    assert not placeholders & {_execution_of(p) for m in data.micro_steps for p in _prefixes(m)}


@PROPERTY
@given(step=steps(), normalization=st.sampled_from(["mean_std", "mean"]))
def test_group_advantages_keep_placeholders_and_leave_out_dropped(
    step: Step, normalization: Normalization
) -> None:
    advantages = group_advantages(step.rollouts, normalization)
    kept = [r for r in step.rollouts if not r.dropped]
    assert set(advantages) == {r.execution_id for r in kept}  # placeholders (reward 0) stay in their group
    for group in {r.group for r in kept}:
        members = [r for r in kept if r.group == group]
        assert math.isclose(sum(advantages[r.execution_id] for r in members), 0.0, abs_tol=1e-6)
        mean = sum(r.reward for r in members) / len(members)
        for r in members:
            if normalization == "mean":
                assert math.isclose(advantages[r.execution_id], r.reward - mean, abs_tol=1e-12)
            else:  # same order as the centred reward
                assert (advantages[r.execution_id] > 0) == (r.reward > mean + 1e-12)


# ---- 5. selection -----------------------------------------------------------------------------------------------
@PROPERTY
@given(ex=executions(), jmax=st.none() | st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_selection_follows_role_priority_and_is_reproducible(
    ex: Execution, jmax: int | None, seed: int
) -> None:
    tree = TrajectoryTree(ex.records)
    sampled = ex.sampled()
    seq_roles: dict[Prefix, set[Role]] = {}
    for i, record in enumerate(ex.records):
        seq_roles.setdefault(tuple(ex.seq(i)), set()).add(record.role)
    info: dict[int, tuple[int, set[Prefix]]] = {}  # leaf -> (rank of its class, sampled prefixes on its path)
    for node in tree.nodes():
        # a node where calls of several roles end is classed by the highest (leaves are such nodes)
        if node.ends:
            assert RANK[tree.leaf_role(node)] == min(RANK[r] for r in seq_roles[tuple(_tokens_to(node))])
    for leaf in tree.leaves():
        path = tuple(_tokens_to(leaf))
        rank = min(RANK[r] for r in seq_roles[path])
        info[id(leaf)] = (rank, {path[:n] for n in range(1, len(path) + 1)} & set(sampled))
    chosen = select_paths(tree, jmax, random.Random(seed))
    assert jmax is None or len(chosen) <= jmax
    masked: set[Prefix] = set()
    ranks = []
    for leaf in chosen:
        open_ranks = {rank for rank, prefixes in info.values() if prefixes - masked}
        rank, prefixes = info[id(leaf)]
        assert prefixes - masked  # it still had something to train
        assert rank == min(open_ranks)  # from the highest class that still has unmasked trainable tokens
        ranks.append(rank)
        masked |= prefixes
    assert ranks == sorted(ranks)
    if jmax is None or len(chosen) < jmax:
        assert masked == set(sampled)  # stopped only when nothing trainable was left
    again = select_paths(tree, jmax, random.Random(seed))
    assert [id(leaf) for leaf in again] == [id(leaf) for leaf in chosen]
    rebuilt = select_paths(TrajectoryTree(ex.records), jmax, random.Random(seed))
    assert [_tokens_to(leaf) for leaf in rebuilt] == [_tokens_to(leaf) for leaf in chosen]


# ---- 6. packing -------------------------------------------------------------------------------------------------
@PROPERTY
@pytest.mark.parametrize("packing", ["tree", "path"])
@given(step=steps(), jmax=st.none() | st.integers(1, 4), budget=st.integers(1, 80))
def test_packed_tokens_sit_at_their_depth_under_their_prefix(
    packing: Packing, step: Step, jmax: int | None, budget: int
) -> None:
    data = build_step(step.rollouts, jmax=jmax, packing=packing, token_budget=budget)
    real = set().union(*(step.truth[eid].prefixes() for eid in _trainable(step)))
    seen: list[Prefix] = []
    for micro in data.micro_steps:
        n = len(micro.input_ids)
        assert n == len(micro.position_ids) == len(micro.parents) == len(micro.weights)
        assert all(w >= 0 and math.isfinite(w) for w in micro.weights)
        assert n <= budget or micro.sequences == 1  # only a sequence longer than the budget overflows, alone
        prefixes = _prefixes(micro)
        assert micro.sequences == sum(1 for p in prefixes if len(p) == 1)
        for i, prefix in enumerate(prefixes):
            assert micro.position_ids[i] == len(prefix) - 1  # depth on its full path
            assert prefix in real  # the ancestors spell a real prefix (its first token names the execution)
        seen += prefixes
    assert len(seen) == data.computed_tokens
    if packing == "tree":
        assert len(seen) == len(set(seen))  # a shared prefix is computed once

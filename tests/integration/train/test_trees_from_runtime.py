"""Records made by the real router and runtime (a built-in agent that delegates and compacts) become the expected
trajectory trees, and tree-packed training on the tiny model computes what per-path training computes."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from fakes import ScriptedEngine
from gyre.agents.toolagent import SUMMARY_REQUEST, BuiltinAgentConfig
from gyre.config import RouterConfig, SandboxConfig
from gyre.engine.models import load_tokenizer
from gyre.journal.records import CallRecord, expand_inputs
from gyre.router.routing import Router
from gyre.runtime import BuiltinAgentSpec, ExecutionResult, ExecutionSpec, Runtime
from gyre.tasks import Task
from gyre.train import MicroStep, Rollout, TrajectoryTree, build_step, select_paths
from gyre.train.loss import every_token, token_logprobs
from gyre.train.objective import policy_loss

pytestmark = pytest.mark.slow(reason="trains the tiny model on a runtime's trees, packed and per path")


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture(scope="module")
def executions(tiny_model: Path) -> list[ExecutionResult]:
    """Two executions of a task whose agent delegates to a sub-agent and compacts both contexts."""
    tokenizer = load_tokenizer(tiny_model)

    def script(ids: list[int]) -> str:
        text = str(tokenizer.decode(ids))
        if text.rstrip().endswith(SUMMARY_REQUEST + "<|im_end|>\n<|im_start|>assistant"):
            return "summary: " + ("the helper counted" if "count the files" in text else "listed the files")
        first_user = text.split("<|im_start|>user")[1]
        resumed = "Your progress so far" in first_user
        if "count the files" in first_user:  # the sub-agent's own context
            return call("submit", answer="2 files") if resumed else call("bash", command="ls | wc -l")
        return call("submit", answer="ok") if resumed else call("delegate", task="count the files")

    config = BuiltinAgentConfig(context_budget_tokens=10)  # every context compacts after its first step
    task = Task(id="tree", instruction="find out how many files there are", files={"a": "1", "b": "2"})
    specs = [ExecutionSpec(task=task, group_index=i, agent=BuiltinAgentSpec(config=config)) for i in range(2)]

    async def go() -> list[ExecutionResult]:
        router = Router(RouterConfig(model_path=str(tiny_model), engines=[engine.url]))
        runtime = Runtime(router, SandboxConfig(), verifier=False)
        try:
            return await runtime.run(specs)
        finally:
            await runtime.aclose()
            await router.aclose()

    with ScriptedEngine(tokenizer, script) as engine:
        return asyncio.run(go())


def test_runtime_records_make_the_expected_tree(executions: list[ExecutionResult]) -> None:
    records = executions[0].records
    assert [r.role for r in records] == [
        "main", "sub-agent", "sub-agent-summary", "sub-agent", "main-summary", "main",
    ]  # fmt: skip
    m1, s1, s_summary, s2, m_summary, m2 = records
    assert (s_summary.parent_call_id, m_summary.parent_call_id) == (s1.call_id, m1.call_id)
    assert s2.parent_call_id is None and m2.parent_call_id is None  # fresh contexts: new branches
    tree = TrajectoryTree(records)
    # four leaves, one per role: the summaries extend the contexts they summarise, the fresh contexts branch
    assert sorted(tree.leaf_role(leaf) for leaf in tree.leaves()) == sorted(
        ["main", "main-summary", "sub-agent", "sub-agent-summary"]
    )
    full = expand_inputs(records)
    sequences = [full[r.call_id] + r.output_ids for r in records]
    prefixes = {tuple(s[:k]) for s in sequences for k in range(1, len(s) + 1)}
    assert tree.size == len(prefixes) < sum(len(s) for s in sequences)  # shared prefixes stored once
    assert tree.trainable == sum(len(r.output_ids) for r in records)  # exactly the sampled tokens
    for leaf in tree.leaves():
        path = [t for node in leaf.path() for t in node.tokens]
        assert tuple(path) in prefixes and any(s == path for s in sequences)
    chosen = select_paths(tree, None, random.Random(0))
    assert [tree.leaf_role(leaf) for leaf in chosen] == [
        "main",
        "main-summary",
        "sub-agent",
        "sub-agent-summary",
    ]
    assert len(select_paths(tree, 1, random.Random(0))) == 1
    # the main-summary path trains the first main call's output too; the main leaf's path does not hold it
    summary_leaf = next(leaf for leaf in chosen if tree.leaf_role(leaf) == "main-summary")
    summary_path = [t for node in summary_leaf.path() for t in node.tokens]
    assert summary_path == full[m_summary.call_id] + m_summary.output_ids


def _rollouts(executions: list[ExecutionResult]) -> list[Rollout]:
    """The executions as policy samples: the scripted engine's records say "scripted", and the policy-gradient
    loss refuses those; what is tested here (packing equivalence) does not depend on who sampled the tokens."""
    return [
        Rollout(execution_id=e.execution_id, group=e.task_id, reward=float(i),
                records=[msgspec.structs.replace(r, source="policy") for r in e.records])
        for i, e in enumerate(executions)
    ]  # fmt: skip


def _prefix(micro: MicroStep, i: int) -> tuple[int, ...]:
    prefix = []
    while i >= 0:
        prefix.append(micro.input_ids[i])
        i = micro.parents[i]
    return tuple(prefix[::-1])


def _backward(
    model: Any, micro_steps: list[MicroStep]
) -> tuple[float, torch.Tensor, dict[tuple[int, ...], float]]:
    """The step's loss, its gradient, and every token's logprob keyed by its whole prefix."""
    model.zero_grad()
    total = 0.0
    by_prefix: dict[tuple[int, ...], float] = {}
    for micro in micro_steps:
        logprobs = token_logprobs(model, micro, scored=every_token(micro))  # each token, weighted or not
        loss = policy_loss(logprobs, micro)
        loss.backward()
        total += loss.item()
        by_prefix.update({_prefix(micro, i): lp for i, lp in enumerate(logprobs.tolist())})
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return total, grad, by_prefix


def test_tree_packed_equals_per_path_on_the_tiny_model(
    executions: list[ExecutionResult], tiny_model: Path
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    rollouts = _rollouts(executions)
    tree = build_step(rollouts, jmax=None, packing="tree", token_budget=8192)
    path = build_step(rollouts, jmax=None, packing="path", token_budget=8192)
    assert (
        tree.trainable_tokens
        == path.trainable_tokens
        == sum(len(r.output_ids) for e in executions for r in e.records)
    )
    assert tree.computed_tokens < path.computed_tokens
    for step in (tree, path):
        assert sum(sum(m.weights) for m in step.micro_steps) == pytest.approx(1.0, abs=1e-9)
    loss_tree, grad_tree, by_tree = _backward(model, tree.micro_steps)
    loss_path, grad_path, by_path = _backward(model, path.micro_steps)
    assert by_tree.keys() == by_path.keys()  # the same tokens, each under the same prefix
    assert max(abs(by_tree[k] - by_path[k]) for k in by_tree) < 1e-5
    assert loss_tree == pytest.approx(loss_path, abs=1e-6)
    assert grad_tree.abs().max() > 0
    assert (grad_tree - grad_path).abs().max().item() < 1e-5


def test_micro_step_split_does_not_change_the_gradient(
    executions: list[ExecutionResult], tiny_model: Path
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    rollouts = _rollouts(executions)
    whole = build_step(rollouts, jmax=None, packing="tree", token_budget=1 << 20)
    split = build_step(rollouts, jmax=None, packing="tree", token_budget=64)
    assert len(whole.micro_steps) == 1 < len(split.micro_steps)
    _, grad_whole, _ = _backward(model, whole.micro_steps)
    _, grad_split, _ = _backward(model, split.micro_steps)
    assert (grad_whole - grad_split).abs().max().item() < 1e-5


def test_records_round_trip_through_the_tree(executions: list[ExecutionResult]) -> None:
    records: list[CallRecord] = executions[1].records
    tree = TrajectoryTree(records)
    full = expand_inputs(records)
    for (
        leaf
    ) in tree.leaves():  # every leaf spells some call's whole input + output, its sampled tokens marked
        path = [t for node in leaf.path() for t in node.tokens]
        (record,) = [r for r in records if full[r.call_id] + r.output_ids == path and r.call_id in
                     {tree.call_ids[i] for i in leaf.ends}]  # fmt: skip
        sampled = [s for node in leaf.path() for s in node.sampled]
        assert sampled[len(path) - len(record.output_ids) :] == [True] * len(record.output_ids)

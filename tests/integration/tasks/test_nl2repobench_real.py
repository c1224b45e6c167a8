"""Five real NL2RepoBench tasks, their hidden tests rebuilt from the upstream projects' own suites
(``tests/data/nl2repobench``, see each UPSTREAM.md), graded as the benchmark grades them: in a no-network sandbox
over the task's prepared environment, the agent's packaging and pytest configuration replaced by the grader's,
``PYTHONPATH=/workspace``, ``min(passed / declared, 1)``.

The upstream code is the reference workspace: it must score 1.0; without one function it must score strictly
between 0 and 1; an empty workspace 0. The environments are built from the registry on first use (cached after).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gyre.config import SandboxConfig
from gyre.tasks import environments
from gyre.tasks.formats import load_task
from gyre.tasks.verify import Verdict, Verifier
from nl2repo_fixtures import FIXTURES, REMOVED
from nl2repo_fixtures import without as _without
from nl2repo_fixtures import write_tree as _write

pytestmark = pytest.mark.slow(reason="builds and grades real NL2RepoBench tasks with their environments")


@pytest.fixture(scope="module")
def verifier(tmp_path_factory: pytest.TempPathFactory) -> Verifier:
    # the environments' cache: shared between runs of the suite (preparing twice does no work)
    return Verifier(SandboxConfig(), retries=0)


@pytest.mark.parametrize("name", sorted(REMOVED))
def test_reference_scores_one_a_removed_function_partial_and_empty_zero(
    name: str, verifier: Verifier, tmp_path: Path
) -> None:
    task = load_task(FIXTURES / name)
    assert task.unsupported is None and task.environment is not None, task.unsupported
    assert task.verifier is not None and task.verifier.declared_test_count

    async def grade(files: dict[str, str | bytes], where: str) -> Verdict:
        return await verifier.verify(task, _write(tmp_path / where, {**task.files, **files}))

    async def run() -> tuple[Verdict, Verdict, Verdict]:
        await verifier.preflight(task)  # refused (raises) when its grading could not be faithful
        reference = await grade(task.solution_files, "reference")
        file, function = REMOVED[name]
        source = task.solution_files[file]
        assert isinstance(source, str)
        broken = await grade({**task.solution_files, file: _without(source, function)}, "removed")
        empty = await grade({}, "empty")
        return reference, broken, empty

    reference, broken, empty = asyncio.run(run())
    declared = task.verifier.declared_test_count
    assert (reference.outcome, reference.score) == ("scored", 1.0), reference.detail[-1500:]
    assert reference.passed is not None and reference.passed >= declared
    assert broken.outcome == "scored" and 0.0 < broken.score < 1.0, (broken.score, broken.detail[-1500:])
    assert (empty.outcome, empty.score) == ("scored", 0.0), empty.detail[-1500:]
    print(f"{name}: declared {declared}, reference passed {reference.passed} failed {reference.failed}, "
          f"without {REMOVED[name][1]} {broken.score:.3f}, empty {empty.score}")  # fmt: skip


def test_the_projects_own_distribution_is_never_installed_from_the_registry() -> None:
    """parse's spec pins parse==1.20.2 itself: installed, an empty workspace would pass its tests."""
    spec = load_task(FIXTURES / "parse").environment
    assert spec is not None and spec.pins and not any(p.lower().startswith("parse==") for p in spec.pins)


def test_environments_are_content_addressed_and_shared() -> None:
    a = load_task(FIXTURES / "retrying").environment
    b = load_task(FIXTURES / "humanize").environment
    assert a is not None and b is not None
    assert environments.environment_key(a) != environments.environment_key(b)
    assert environments.environment_key(a) == environments.environment_key(
        load_task(FIXTURES / "retrying").environment
    )  # type: ignore[arg-type]

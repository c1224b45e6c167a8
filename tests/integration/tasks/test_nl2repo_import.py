"""`gyre tasks import-nl2repobench` (issue 32) on the five real tasks, from sdist-shaped archives of their upstream
trees built from ``tests/data/nl2repobench`` (no network): the public folders go in unchanged, the importer decides
what is hidden test, grader and reference, and the imported tasks grade as the hand-built fixtures do."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from pathlib import Path

import pytest

from gyre.cli import main
from gyre.config import SandboxConfig
from gyre.tasks.formats import load_task
from gyre.tasks.nl2repo_import import PUBLIC_FILES, spec_tree_top
from gyre.tasks.verify import Verdict, Verifier
from nl2repo_fixtures import FIXTURES, REMOVED, without, write_tree

TASKS = sorted(REMOVED)
NOISE = {
    ".github/workflows/ci.yml": "on: push\n",
    "PKG-INFO": "Metadata-Version: 2.1\n",
    ".gitignore": "*.pyc\n",
}


def upstream_tree(name: str) -> dict[str, bytes]:
    """What the project's sdist would hold: the reference, the grader's files, the hidden tests, and noise."""
    task = load_task(FIXTURES / name)
    # an sdist's PKG-INFO is whole (hatchling refuses one without a Name); the importer gives it to grader/
    pkg_info = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    files = {**task.hidden_files, **task.solution_files, **NOISE, "PKG-INFO": pkg_info}
    return {rel: data if isinstance(data, bytes) else data.encode() for rel, data in files.items()}


def sdist(path: Path, name: str, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for rel, data in sorted(files.items()):
            info = tarfile.TarInfo(f"{name}-1.0/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the benchmark repository with the five public folders, a sources file naming an sdist for each)."""
    root = tmp_path_factory.mktemp("bench")
    lines = []
    for name in TASKS:
        folder = root / "repo" / "test_files" / name
        folder.mkdir(parents=True)
        for public in (*PUBLIC_FILES, "environment.toml"):  # extra pins travel with the public folder
            if (FIXTURES / name / public).is_file():
                (folder / public).write_bytes((FIXTURES / name / public).read_bytes())
        sdist(root / f"{name}-1.0.tar.gz", name, upstream_tree(name))
        lines.append(f'"{name}" = "{name}-1.0.tar.gz"')
    (root / "sources.toml").write_text("\n".join(lines) + "\n")
    return root / "repo", root / "sources.toml"


def test_the_five_tasks_import_with_the_hidden_tests_grader_and_reference_split(
    bench: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo, sources = bench
    code = main(["tasks", "import-nl2repobench", str(repo), str(tmp_path / "out"), "--sources", str(sources)])
    out = capsys.readouterr()
    assert code == 0 and "5 of 5 task(s) imported" in out.err, out
    for name in TASKS:
        imported, fixture = load_task(tmp_path / "out" / name), load_task(FIXTURES / name)
        assert imported.unsupported is None and imported.verifier == fixture.verifier
        tests = set(json.loads((FIXTURES / name / "test_files.json").read_text()))
        assert _under(imported.hidden_files, tests) == _under(fixture.hidden_files, tests) != set()
        # every file the hand-built fixture gives the agent to write is the reference's; no noise anywhere
        assert set(fixture.solution_files) <= set(imported.solution_files), name
        everything = set(imported.hidden_files) | set(imported.solution_files)
        noise = set(NOISE) - {
            "PKG-INFO"
        }  # an sdist's metadata is packaging: the grader's (version plugins read it)
        assert not everything & noise and "PKG-INFO" in imported.hidden_files, (name, everything & noise)
        assert {"setup.py", "pyproject.toml"} & set(imported.hidden_files), name  # packaging is the grader's
        assert imported.environment == fixture.environment or name == "retrying"  # setup.py read: same pins


def _under(paths: dict[str, object], tests: set[str]) -> set[str]:
    return {p for p in paths if any(p == t or p.startswith(t + "/") for t in tests)}


def test_what_cannot_be_imported_is_listed_with_its_stage(
    bench: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo, _ = bench
    without_test = {k: v for k, v in upstream_tree("retrying").items() if k != "test_retrying.py"}
    broken = sdist(tmp_path / "retrying.tar.gz", "retrying", without_test)
    code = main(["tasks", "import-nl2repobench", str(repo), str(tmp_path / "out"), "--all",
                 "--source", f"retrying={broken}", "--source", "parse=pypi-typo:parse"])  # fmt: skip
    out = capsys.readouterr()
    assert code == 1 and "0 of 5 task(s) imported" in out.err
    text = " ".join(out.out.split())
    assert (
        "refused (hidden tests)" in text
        and "names test_retrying.py, which the upstream source does not have" in text
    )
    assert "refused (source)" in text and "no upstream source given" in text  # humanize, stamina, docopt-ng
    assert "pypi-typo:parse" in text and "no such directory or archive" in text


def test_the_specs_tree_limits_the_reference_to_what_it_draws() -> None:
    tree = spec_tree_top((FIXTURES / "retrying" / "start.md").read_text())
    assert tree is not None and {"retrying.py", "setup.py", "README.rst", ".travis.yml"} <= tree
    assert spec_tree_top("# no tree here\n") is None


@pytest.mark.slow(reason="builds the five tasks' environments and grades each imported task three times")
@pytest.mark.parametrize("name", TASKS)
def test_imported_tasks_grade_perfect_gutted_and_empty(
    name: str, bench: tuple[Path, Path], tmp_path: Path
) -> None:
    repo, sources = bench
    assert main(["tasks", "import-nl2repobench", str(repo), str(tmp_path / "out"), "--sources", str(sources),
                 "--tasks", name]) == 0  # fmt: skip
    task = load_task(tmp_path / "out" / name)
    verifier = Verifier(SandboxConfig(), retries=0)
    file, function = REMOVED[name]
    source = task.solution_files[file]
    assert isinstance(source, str)

    async def run() -> list[Verdict]:
        await verifier.preflight(task)
        grades = []
        for where, files in (("reference", task.solution_files),
                             ("gutted", {**task.solution_files, file: without(source, function)}), ("empty", {})):  # fmt: skip
            grades.append(await verifier.verify(task, write_tree(tmp_path / where, {**task.files, **files})))
        return grades

    reference, gutted, empty = asyncio.run(run())
    assert (reference.outcome, reference.score) == ("scored", 1.0), reference.detail[-1500:]
    assert gutted.outcome == "scored" and 0.0 < gutted.score < 1.0, (gutted.score, gutted.detail[-1500:])
    assert (empty.outcome, empty.score) == ("scored", 0.0), empty.detail[-1500:]

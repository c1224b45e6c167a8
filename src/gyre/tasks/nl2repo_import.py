"""Build Gyre task folders from NL2RepoBench's public folders and each project's upstream source.

NL2RepoBench publishes, per task, the spec (``start.md``), the grading commands, the hidden test paths and the
declared test count; the hidden tests themselves, the packaging and the reference live in its grading images, which
are built from each upstream project. `import_benchmark` rebuilds what such an image holds from the upstream source:

- the hidden tests: every path ``test_files.json`` lists, taken from the same path in the source;
- ``grader/``: the packaging and configuration the benchmark's grader deletes from an agent's workspace and puts
  back from its image (`gyre.tasks.formats.NL2REPO_REMOVED`: ``setup.py``, ``pyproject.toml``, ``conftest.py``,
  ...) with ``.pytest.ini``, and the test infrastructure beside listed test files (``tests/__init__.py``, test data);
- ``solution/``: the rest of the project (the reference the agent is asked to write), limited to the top-level
  entries the spec's "Project Directory Structure" names when it has one (importable code is always kept), without
  VCS and CI files (an sdist's ``PKG-INFO`` goes to ``grader/``: version plugins read it).

Sources: a local checkout (a directory), a local sdist (``.tar.gz``, ``.zip``), ``pypi:NAME==VERSION``
(``pip download`` of the sdist from the package registry) or ``git:URL@REV``. The network is used only for the last
two, and only here. Whatever cannot be built is returned with one reason, classified (`ImportResult.stage`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

from gyre.errors import TaskError
from gyre.tasks.formats import NL2REPO_GRADER_DIR, NL2REPO_REMOVED

PUBLIC_FILES = ("start.md", "test_commands.json", "test_files.json", "test_case_count.txt")
# the packaging and configuration the grader puts back, pytest's other configuration file (the published grader
# does not delete `.pytest.ini`, but its image holds the project's: parse's adds the README's doctests to the count)
# and an sdist's PKG-INFO (setuptools-scm and hatch-vcs read the version from it where there is no git history)
GRADER_NAMES = frozenset(
    [*(pattern.removeprefix("**/") for pattern in NL2REPO_REMOVED), ".pytest.ini", "PKG-INFO"]
)
# never part of a task: version control, CI, editor and build leftovers, sdist metadata
LEFT_OUT = (
    ".git", ".git/*", ".github/*", ".gitlab-ci.yml", ".gitignore", ".gitattributes", ".travis.yml",
    ".pre-commit-config.yaml", ".readthedocs.y*ml", ".coveragerc", ".editorconfig", "*.egg-info/*",
    "*__pycache__*", "*.pyc", ".tox/*", ".mypy_cache/*", ".pytest_cache/*",
)  # fmt: skip
FETCH_TIMEOUT_S = 600
Stage = Literal["imported", "source", "hidden tests", "task files"]


@dataclass
class ImportResult:
    """One task: imported (its folder, what went where) or refused at a stage, with the reason."""

    task: str
    stage: Stage
    reason: str = ""
    folder: str = ""
    source: str = ""  # provenance: what was unpacked
    tests: list[str] = field(default_factory=list)
    grader: list[str] = field(default_factory=list)
    solution: list[str] = field(default_factory=list)

    @property
    def imported(self) -> bool:
        return self.stage == "imported"


@dataclass(frozen=True)
class Split:
    """Where each upstream file goes (relative POSIX paths)."""

    tests: list[str]
    grader: list[str]
    solution: list[str]


def find_tasks(bench: Path) -> dict[str, Path]:
    """The public task folders of ``bench``: the benchmark repository (its ``test_files/``) or that folder itself."""
    root = bench / "test_files" if (bench / "test_files").is_dir() else bench
    if not root.is_dir():
        raise TaskError(f"{bench}: not an NL2RepoBench repository or test_files folder")
    found = {p.name: p for p in sorted(root.iterdir()) if p.is_dir() and (p / "test_files.json").is_file()}
    if not found:
        raise TaskError(f"{root}: no task folders (directories holding test_files.json)")
    return found


def read_sources(path: Path) -> dict[str, str]:
    """A sources file: TOML, ``task = "SPEC"`` per line (SPEC as `unpack_source` takes it)."""
    import tomllib

    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise TaskError(f"{path}: cannot read the sources file: {exc}") from None
    bad = [k for k, v in data.items() if not isinstance(v, str)]
    if bad:
        raise TaskError(
            f"{path}: field {bad[0]!r}: expected a source string (a path, pypi:NAME==VERSION, git:URL@REV)"
        )
    return {k: str(v) for k, v in data.items()}


def unpack_source(spec: str, work: Path, base: Path | None = None) -> tuple[Path, str]:
    """Unpack the source ``spec`` names into ``work``; its root and a provenance line. `TaskError` saying why not."""
    if spec.startswith("pypi:"):
        requirement = spec.removeprefix("pypi:")
        argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", requirement,
                "-d", str(work / "dl")]  # fmt: skip
        _run(argv, f"pip download {requirement}")
        archives = sorted((work / "dl").iterdir())
        if len(archives) != 1:
            raise TaskError(f"pip download {requirement} gave {len(archives)} files, not one sdist")
        root, _ = unpack_source(str(archives[0]), work / "sdist")
        digest = hashlib.sha256(archives[0].read_bytes()).hexdigest()
        return root, f"PyPI sdist `{archives[0].name}`, sha256 `{digest}`"
    if spec.startswith("git:"):
        url, _, rev = spec.removeprefix("git:").rpartition("@")
        if not url or not rev:
            raise TaskError(f"source {spec!r}: expected git:URL@REV")
        dest = work / "git"
        dest.mkdir(parents=True)
        _run(["git", "init", "-q", str(dest)], "git init")
        _run(["git", "-C", str(dest), "fetch", "-q", "--depth", "1", url, rev], f"git fetch {url} {rev}")
        _run(["git", "-C", str(dest), "checkout", "-q", "FETCH_HEAD"], "git checkout")
        commit = _run(["git", "-C", str(dest), "rev-parse", "HEAD"], "git rev-parse").strip()
        shutil.rmtree(dest / ".git")
        return dest, f"git `{url}` at `{rev}` (commit `{commit}`)"
    path = Path(spec) if base is None or Path(spec).is_absolute() else base / spec
    if path.is_dir():
        return path, f"local directory `{path}`"
    if not path.is_file():
        raise TaskError(f"source {spec!r}: no such directory or archive")
    dest = work / "unpacked"
    dest.mkdir(parents=True, exist_ok=True)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                _check_members(path, archive.namelist())
                archive.extractall(dest)
        else:
            with tarfile.open(path) as archive:
                archive.extractall(dest, filter="data")  # no links out, no devices, no absolute paths
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as exc:
        raise TaskError(f"source {spec!r}: cannot unpack it: {exc}") from None
    entries = list(dest.iterdir())
    root = entries[0] if len(entries) == 1 and entries[0].is_dir() else dest  # an sdist's NAME-VERSION/
    return root, f"archive `{path.name}`, sha256 `{hashlib.sha256(path.read_bytes()).hexdigest()}`"


def _check_members(path: Path, names: list[str]) -> None:
    for name in names:
        parts = PurePosixPath(name).parts
        if name.startswith("/") or ".." in parts:
            raise TaskError(f"source {path}: member {name!r} would be written outside the folder")


def _run(argv: list[str], what: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TaskError(f"{what}: {exc}") from None
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip())[-1500:]
        raise TaskError(f"{what} failed (exit {done.returncode}): {tail}")
    return done.stdout


_TREE_LINE = re.compile(
    r"^(?P<indent>(?:[│|]\s{2,3}|\s{3,4})*)(?:[├└]──|[|`]--)\s*(?P<name>[^#\s][^#]*?)\s*(?:#.*)?$"
)


def spec_tree_top(start_md: str) -> set[str] | None:
    """The top-level entries of the spec's "Project Directory Structure" tree (``workspace/`` stripped); None when
    the spec draws none."""
    section = re.search(r"Directory Structure.*?```[^\n]*\n(.*?)```", start_md, re.DOTALL | re.IGNORECASE)
    if section is None:
        return None
    top: set[str] = set()
    for line in section.group(1).splitlines():
        m = _TREE_LINE.match(line.rstrip())
        if m is None:
            continue
        depth = len(re.findall(r"[│|]\s{2,3}|\s{3,4}", m.group("indent")))
        if depth == 0:
            top.add(m.group("name").rstrip("/"))
    return top or None


def split_source(root: Path, hidden: list[str], tree_top: set[str] | None) -> Split:
    """Decide where each file of the upstream tree ``root`` goes (see the module); `TaskError` when a hidden test
    path is not in it."""
    files = sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and not p.is_symlink()
    )
    files = [f for f in files if not any(fnmatch.fnmatch(f, pattern) for pattern in LEFT_OUT)]
    tests: list[str] = []
    for rel in hidden:
        rel = rel.strip("/")
        under = [f for f in files if f == rel or f.startswith(rel + "/")]
        if not under:
            raise TaskError(f"test_files.json names {rel}, which the upstream source does not have")
        tests += under
    hidden_set = set(tests)
    # test infrastructure: the other files of the directories holding listed test files (not the root's)
    test_dirs = {str(PurePosixPath(t).parent) for t in tests if str(PurePosixPath(t).parent) != "."}
    grader, solution = [], []
    for rel in files:
        if rel in hidden_set:
            continue
        path = PurePosixPath(rel)
        in_test_dir = any(rel.startswith(d + "/") for d in test_dirs)
        if path.name in GRADER_NAMES or in_test_dir:
            grader.append(rel)
        elif tree_top is None or path.parts[0] in tree_top or _code(root, path.parts[0]):
            solution.append(rel)
    return Split(tests=sorted(hidden_set), grader=grader, solution=solution)


def _code(root: Path, top: str) -> bool:
    """Whether the top-level entry ``top`` is importable code (a module, a package, ``src/``): the reference keeps it
    even where the spec's tree leaves it out (more-Itertools' spec draws another project's tree)."""
    entry = root / top
    return top == "src" or (entry.is_file() and top.endswith(".py")) or (entry / "__init__.py").is_file()


def import_task(folder: Path, spec: str | None, out: Path, base: Path | None = None) -> ImportResult:
    """Import one public task ``folder`` with its upstream source ``spec`` into ``out/<task>``."""
    name = folder.name
    missing = [f for f in PUBLIC_FILES if not (folder / f).is_file()]
    if missing:
        return ImportResult(name, "task files", f"the public folder has no {', '.join(missing)}")
    try:
        hidden = json.loads((folder / "test_files.json").read_text())
    except (OSError, ValueError) as exc:
        return ImportResult(name, "task files", f"test_files.json: {exc}")
    if not isinstance(hidden, list) or not all(isinstance(h, str) and h.strip() for h in hidden):
        return ImportResult(name, "task files", "test_files.json: expected a list of paths")
    if spec is None:
        return ImportResult(name, "source", "no upstream source given (--source TASK=SPEC or --sources FILE)")
    with tempfile.TemporaryDirectory(prefix="gyre-import-") as tmp:
        try:
            root, provenance = unpack_source(spec, Path(tmp), base)
        except TaskError as exc:
            return ImportResult(name, "source", str(exc))
        try:
            split = split_source(root, hidden, spec_tree_top((folder / "start.md").read_text()))
        except TaskError as exc:
            return ImportResult(name, "hidden tests", str(exc), source=provenance)
        dest = out / name
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        for public in PUBLIC_FILES:
            shutil.copy2(folder / public, dest / public)
        if (folder / "environment.toml").is_file():  # extra pins kept with the public folder
            shutil.copy2(folder / "environment.toml", dest / "environment.toml")
        for files, into in ((split.tests, dest), (split.grader, dest / NL2REPO_GRADER_DIR),
                            (split.solution, dest / "solution")):  # fmt: skip
            for rel in files:
                (into / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / rel, into / rel)
        (dest / "UPSTREAM.md").write_text(
            f"# {name}: provenance\n\n- Task files: `{folder}`, unchanged.\n- Upstream source: {provenance}.\n"
            f"- Hidden tests ({len(split.tests)} files), grader/ ({len(split.grader)}), solution/ "
            f"({len(split.solution)}): split by `gyre tasks import-nl2repobench`.\n"
        )
    return ImportResult(name, "imported", folder=str(dest), source=provenance, tests=split.tests,
                        grader=split.grader, solution=split.solution)  # fmt: skip


def import_benchmark(
    bench: Path,
    out: Path,
    sources: dict[str, str],
    only: list[str] | None = None,
    base: Path | None = None,
) -> list[ImportResult]:
    """Import every public task of ``bench`` (or those named in ``only``) into ``out``, one result each."""
    tasks = find_tasks(bench)
    unknown = sorted(set(only or []) - set(tasks))
    if unknown:
        raise TaskError(f"{bench}: no task folder named {', '.join(unknown)}")
    out.mkdir(parents=True, exist_ok=True)
    return [import_task(tasks[name], sources.get(name), out, base) for name in (only or sorted(tasks))]

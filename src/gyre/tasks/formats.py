"""Loaders that turn a task directory (Gyre, NL2RepoBench or Harbor layout) into a `Task`.

Layouts, detected in this order:

- NL2RepoBench: ``start.md`` (the instruction), ``test_commands.json`` (shell strings), ``test_files.json`` (hidden
  test paths; the public folders do not ship their contents), ``test_case_count.txt`` (the score's denominator).
- Gyre: ``task.toml`` with a top-level ``id``, ``instruction.md``, ``workspace/`` (starting files) and hidden
  ``tests/`` (copied in only for verification).
- Harbor: ``task.toml`` without ``id``, ``instruction.md``, ``tests/test.sh`` writing a reward file. A task that asks
  for a container image runs in containers of it (`gyre.sandbox.container`); where no container runtime works, or
  the image is not in its local store, it loads with ``unsupported`` set saying which.

Every malformed directory raises `TaskError` naming the file and the field.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
import shlex
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from gyre.errors import TaskError
from gyre.sandbox.container import image_problem
from gyre.tasks import grading
from gyre.tasks.environments import check_spec
from gyre.tasks.task import EnvironmentSpec, FileData, Task, TaskLimits, VerifierSpec

Format = Literal["gyre", "nl2repo", "harbor"]
S = TypeVar("S", bound=msgspec.Struct)
Seconds = Annotated[float, msgspec.Meta(gt=0)]

# What the NL2RepoBench grader deletes from the agent's workspace, at any depth, before its image's own files (the
# hidden tests, packaging and configuration: here the hidden files and ``grader/``) go in; and conftest files, which
# would let an agent steer pytest (the task's own are put back).
NL2REPO_REMOVED = tuple(
    f"**/{name}"
    for name in (
        "setup.py", "pyproject.toml", "setup.cfg", "requirements.txt", "requirements-dev.txt",
        "requirements-test.txt", "tox.ini", "pytest.ini", "poetry.lock", "Pipfile", "Pipfile.lock",
        "environment.yml", "conda-env.yaml", "manifest.in", "MANIFEST.in", "conftest.py",
    )
)  # fmt: skip
# files the benchmark's grading image holds in /workspace besides the hidden tests (packaging, configuration)
NL2REPO_GRADER_DIR = "grader"
# What a build backend asks for, beyond its build-system.requires, to build an editable install (its
# get_requires_for_build_editable hook); without build isolation nothing installs it on demand
EDITABLE_NEEDS = {"hatchling.build": ["editables"]}
HARBOR_REWARD_PATH = "/logs/verifier/reward.txt"  # Harbor's contract: test.sh writes the reward here
HARBOR_TEST_COMMAND = "bash tests/test.sh"
HARBOR_SOLVE_COMMAND = "bash solution/solve.sh; status=$?; rm -rf solution; exit $status"


def load_task(path: str | Path) -> Task:
    """Load the task in directory ``path``, detecting its format."""
    root = Path(path)
    match detect_format(root):
        case "nl2repo":
            return _load_nl2repo(root)
        case "harbor":
            return _load_harbor(root)
        case "gyre":
            return _load_gyre(root)


def load_suite(path: str | Path) -> list[Task]:
    """Load every task directory in ``path``, sorted by name; one `TaskError` lists every bad task."""
    root = Path(path)
    if not root.is_dir():
        raise TaskError(f"{root}: suite directory not found")
    tasks: list[Task] = []
    errors: list[str] = []
    seen: dict[str, Path] = {}
    for child in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        try:
            task = load_task(child)
        except TaskError as e:
            errors.append(str(e))
            continue
        if task.id in seen:
            errors.append(f"{child}: field 'id': {task.id!r} is also the id of {seen[task.id]}")
            continue
        seen[task.id] = child
        tasks.append(task)
    if errors:
        raise TaskError(
            f"{len(errors)} bad task(s) in suite {root}:\n" + "\n".join(f"  - {e}" for e in errors)
        )
    if not tasks:
        raise TaskError(f"{root}: no task directories in suite")
    return tasks


def detect_format(root: Path) -> Format:
    """Which layout ``root`` uses; `TaskError` when it is none of them."""
    if not root.is_dir():
        raise TaskError(f"{root}: task directory not found")
    if (root / "start.md").exists() or (root / "test_case_count.txt").exists():
        return "nl2repo"
    if (root / "task.toml").exists():
        if "id" not in _read_toml(root / "task.toml") and (root / "tests" / "test.sh").is_file():
            return "harbor"
        return "gyre"
    raise TaskError(
        f"{root}: not a task directory: expected task.toml (Gyre or Harbor) or start.md (NL2RepoBench)"
    )


# --- Gyre ------------------------------------------------------------------------------------------------------------


class _GyreToml(msgspec.Struct, kw_only=True):
    """The schema of a Gyre ``task.toml``."""

    id: str
    time_budget_s: Seconds = 3600.0
    verifier: VerifierSpec
    limits: TaskLimits = msgspec.field(default_factory=TaskLimits)
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    expert: str | None = None  # a scripted expert that solves it (gyre.tasks.catalog.EXPERTS)


def _load_gyre(root: Path) -> Task:
    toml_path = root / "task.toml"
    data = _read_toml(toml_path)
    _reject_unknown(toml_path, data, _GyreToml, "")
    for table, struct in (("verifier", VerifierSpec), ("limits", TaskLimits)):
        if isinstance(data.get(table), dict):
            _reject_unknown(toml_path, data[table], struct, table + ".")
    spec = _convert(toml_path, data, _GyreToml)
    if not spec.id.strip():
        raise TaskError(f"{toml_path}: field 'id': must not be empty")
    _check_verifier(toml_path, spec.verifier)
    return Task(
        id=spec.id,
        instruction=_read_instruction(root / "instruction.md"),
        files=_read_tree(root / "workspace", prefix=""),
        time_budget_s=spec.time_budget_s,
        metadata=spec.metadata,
        format="gyre",
        hidden_files=_read_tree(root / "tests", prefix="tests/"),
        verifier=spec.verifier,
        limits=spec.limits,
        source_dir=str(root.resolve()),
        solution_files=_read_tree(root / "solution", prefix=""),
        expert=spec.expert,
    )


# --- NL2RepoBench ----------------------------------------------------------------------------------------------------


def _load_nl2repo(root: Path) -> Task:
    commands = _read_json(root / "test_commands.json")
    if not isinstance(commands, list) or not commands:
        raise TaskError(
            f"{root / 'test_commands.json'}: field 'test_commands': expected a non-empty list of strings"
        )
    for i, command in enumerate(commands):
        if not isinstance(command, str) or not command.strip():
            raise TaskError(
                f"{root / 'test_commands.json'}: field 'test_commands[{i}]': expected a non-empty shell string, "
                f"got {command!r}"
            )
    test_files = _read_json(root / "test_files.json")
    if not isinstance(test_files, list):
        raise TaskError(f"{root / 'test_files.json'}: field 'test_files': expected a list of paths")
    # the grading image's other files first: a hidden test path of the same name wins
    hidden = _read_tree(root / NL2REPO_GRADER_DIR, prefix="")
    missing: list[str] = []
    for i, rel in enumerate(test_files):
        where = f"{root / 'test_files.json'}: field 'test_files[{i}]'"
        _check_relative(where, rel)
        if (root / rel).is_file():  # shipped next to the spec (e.g. Gyre's own suites)
            hidden[rel] = _read_data(root / rel)
        elif (root / rel).is_dir() and (tree := _read_tree(root / rel, prefix=rel.rstrip("/") + "/")):
            hidden |= tree  # a directory of hidden tests ("tests"), shipped whole
        else:  # the public folders list paths whose contents live in the benchmark's grading images
            missing.append(rel)
    count_path = root / "test_case_count.txt"
    raw = _read_text(count_path).strip()
    if not re.fullmatch(r"\d+", raw):
        raise TaskError(
            f"{count_path}: field 'test_case_count': expected a non-negative integer, got {raw!r}"
        )
    unsupported = None
    if missing:
        unsupported = f"its hidden tests are not shipped ({', '.join(missing)}); NL2RepoBench keeps them in its grading images"
    verifier = VerifierSpec(
        commands=tuple(commands),
        result="junit",  # pytest reports through PYTEST_ADDOPTS: the commands stay verbatim
        declared_test_count=int(raw),
        remove=NL2REPO_REMOVED,
    )
    return Task(
        id=root.name,
        instruction=_read_instruction(root / "start.md"),
        format="nl2repo",
        hidden_files=hidden,
        missing_hidden_files=tuple(missing),
        verifier=verifier,
        source_dir=str(root.resolve()),
        unsupported=unsupported,
        solution_files=_read_tree(root / "solution", prefix=""),
        environment=_nl2repo_environment(root, hidden, [str(t) for t in test_files]),
    )


# The spec's environment section: "The Python version used in the current project is: Python 3.10.11", then code
# blocks of "name  version" lines (a pip freeze of the grading image) or of requirement lines with comments
# ("trio   # Asynchronous testing support", "path-dict~=3.0.4")
_PYTHON_VERSION = re.compile(r"Python version[^\n]*?:\s*(?:Python\s*)?(\d+\.\d+(?:\.\d+)?)", re.IGNORECASE)
_FREEZE_LINE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s+(?:==\s*)?v?([0-9][A-Za-z0-9.+!_-]*)\s*$")
_REQUIREMENT_LINE = re.compile(
    r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9,._ -]+\])?\s*"
    r"((?:(?:===?|~=|>=|<=|!=|>|<)\s*[0-9][A-Za-z0-9.*+!_-]*\s*,?\s*)*)(#.*)?$"
)
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
_ENVIRONMENT_HEADING = re.compile(r"\benvironment\b", re.IGNORECASE)
_WITHIN_ENVIRONMENT = re.compile(r"depend|python version|librar", re.IGNORECASE)


def _environment_section(text: str) -> tuple[str, list[list[str]]]:
    """The spec's environment section (its prose, and the lines of each code block), read as markdown: a ``#`` line
    inside a code fence is a comment, not a heading; the section runs from its heading to the next heading of its
    level or above that is not about the Python version or the dependencies."""
    prose: list[str] = []
    blocks: list[list[str]] = []
    level = 0  # the environment heading's level; 0: not in the section
    fence: list[str] | None = None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if fence is None:
                fence = []
            else:
                if level:
                    blocks.append(fence)
                fence = None
            continue
        if fence is not None:
            fence.append(line)
            continue
        heading = _HEADING.match(line)
        if heading is not None:
            depth, title = len(heading[1]), heading[2]
            if not level and _ENVIRONMENT_HEADING.search(title) and not blocks:
                level = depth
                continue
            if level and depth <= level and not _WITHIN_ENVIRONMENT.search(title):
                break
        if level:
            prose.append(line)
    return "\n".join(prose), blocks


def _test_imports(hidden: dict[str, FileData]) -> set[str]:
    """The top-level modules the hidden Python files import (absolute imports, ``importorskip``), read, never run."""
    out: set[str] = set()
    for path, data in hidden.items():
        if not path.endswith(".py") or not isinstance(data, str):
            continue
        try:
            tree = ast.parse(data)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module.split(".")[0])
            elif (  # pytest.importorskip("numpy"): a test the image ran, not one to skip
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "importorskip"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                out.add(node.args[0].value.split(".")[0])
    return out


def _test_words(hidden: dict[str, FileData]) -> set[str]:
    """The words of the hidden Python files (identifiers, and the words of their strings), as canonical names."""
    out: set[str] = set()
    for path, data in hidden.items():
        if path.endswith(".py") and isinstance(data, str):
            out |= {_canonical(word) for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", data)}
    return out


def _spec_dependencies(text: str, imported: set[str]) -> tuple[str | None, list[str], list[str]]:
    """The spec's Python version, its freeze list (pins), and those of its requirement lines the hidden tests import
    (a list of tools the image had, "trio  # Asynchronous testing support": installing every tool it names would
    build documentation and lint stacks for nothing, and its old pins of those often no longer install)."""
    prose, blocks = _environment_section(text)
    python = m.group(1) if (m := _PYTHON_VERSION.search(prose)) else None
    pins: list[str] = []
    requirements: list[str] = []
    for block in blocks:
        for line in block:
            if m := _FREEZE_LINE.match(line):
                pins.append(f"{m[1]}=={m[2]}")
            elif (
                (m := _REQUIREMENT_LINE.match(line))
                and (m[3].strip() or m[4])
                and _canonical(m[1]) in imported
                and m[1] not in sys.stdlib_module_names  # autojump's spec lists "os>=1.0.0"
            ):
                requirements.append(f"{m[1]}{m[2] or ''}{m[3].strip().rstrip(',')}")
    return python, pins, requirements


# command-line options of pytest plugins that projects put in their configuration's addopts: without the plugin,
# pytest refuses its command line before collecting anything (tqdm's --asyncio-mode, mechanicalsoup's --cov)
ADDOPTS_PLUGINS = {
    "--cov": "pytest-cov", "--no-cov": "pytest-cov", "--asyncio-mode": "pytest-asyncio",
    "--flake8": "pytest-flake8", "--timeout": "pytest-timeout", "-n": "pytest-xdist",
    "--numprocesses": "pytest-xdist", "--dist": "pytest-xdist", "--benchmark": "pytest-benchmark",
    "--reruns": "pytest-rerunfailures", "--mypy": "pytest-mypy", "--black": "pytest-black",
    "--isort": "pytest-isort", "--pylint": "pytest-pylint", "--html": "pytest-html", "--mpl": "pytest-mpl",
    "--nbval": "nbval", "--snapshot-update": "syrupy", "--randomly-seed": "pytest-randomly",
    "--randomly-dont-reorganize": "pytest-randomly",
    "--doctest-plus": "pytest-doctestplus", "--env": "pytest-env", "--mock-use-standalone-module": "pytest-mock",
}  # fmt: skip


# ini options of pytest plugins: unknown to pytest without them, an error under --strict-config or a filterwarnings of
# "error" (tqdm's timeout)
INI_PLUGINS = {
    "timeout": "pytest-timeout", "timeout_method": "pytest-timeout", "timeout_func_only": "pytest-timeout",
    "asyncio_mode": "pytest-asyncio", "asyncio_default_fixture_loop_scope": "pytest-asyncio",
    "env": "pytest-env", "mock_use_standalone_module": "pytest-mock", "django_settings_module": "pytest-django",
    "trio_mode": "pytest-trio", "flake8-ignore": "pytest-flake8", "flake8-max-line-length": "pytest-flake8",
    "mpl-baseline-path": "pytest-mpl", "doctest_plus": "pytest-doctestplus", "rerun_except": "pytest-rerunfailures",
}  # fmt: skip


def _addopts_plugins(hidden: dict[str, FileData]) -> list[str]:
    """The pytest plugins the task's pytest configuration needs: those its ``addopts`` options and its ini options
    belong to."""
    found = grading.pytest_options(hidden)
    keys = [
        str(key).lower() for key in (found[2] if found else {})
    ]  # an ini file's keys are case-insensitive
    out = [INI_PLUGINS[key] for key in keys if key in INI_PLUGINS]
    raw = found[2].get("addopts", "") if found else ""
    text = " ".join(str(a) for a in raw) if isinstance(raw, list) else str(raw)
    try:
        words = shlex.split(text)
    except ValueError:
        words = []
    for word in words:
        option = word.split("=", 1)[0]
        plugin = ADDOPTS_PLUGINS.get(option) or next(
            (v for k, v in ADDOPTS_PLUGINS.items() if k.startswith("--") and option.startswith(k + "-")), None
        )
        if plugin:
            out.append(plugin)
    return list(dict.fromkeys(out))


def _nl2repo_environment(
    root: Path, hidden: dict[str, FileData], test_paths: list[str]
) -> EnvironmentSpec | None:
    """What the task's commands need: the spec's freeze list (pins) and the requirements it lists that the hidden
    tests import, the grader's declared dependencies (its ``pyproject.toml``, ``setup.py``...) with the test
    dependencies its other extras hold, the pytest plugins its pytest configuration needs, then
    ``environment.toml``'s ``[environment]``; never the project itself; None when it declares nothing."""
    tests = {  # what the hidden tests name, not the packaging beside them
        path: data
        for path, data in hidden.items()
        if any(path == t or path.startswith(t.rstrip("/") + "/") for t in test_paths)
    }
    # parsed once (a suite can be thousands of tests), for the spec's requirement lines and the extras alike
    imported = {_canonical(name) for name in _test_imports(tests)}
    python, pins, listed = _spec_dependencies(_read_text(root / "start.md"), imported)
    # the project the agent writes is never installed from the registry (a freeze of its image may list it: an
    # empty workspace would pass)
    own = {_canonical(root.name), *(_canonical(n) for n in _project_names(hidden))}
    pins = [p for p in pins if _canonical(p.split("==")[0]) not in own]
    requirements = [r for r in listed if _requirement_name(r) not in own]
    pyproject = hidden.get("pyproject.toml")
    words = _test_words(tests)
    project = pyproject if isinstance(pyproject, str) else None
    core = _grader_requirements(root, project, _no_other_extra) + _setuptools_requirements(
        hidden, _no_other_extra
    )
    have = {_requirement_name(r) for r in (*requirements, *core, *pins)}

    def wanted(extra: str, requirement: str) -> bool:
        """Another extra's requirement joins when it is a new distribution the hidden tests import (deepdiff's
        uuid6), or a development extra's that they name (stamina's "trio" backend); never an alternative build of
        one already required (math-verify's antlr4 variants) nor a backend they only mention (python-jose's
        pycrypto, which no longer compiles)."""
        name = _requirement_name(requirement)
        return name not in have and (name in imported or (extra.lower() in _DEV_EXTRAS and name in words))

    requirements += core
    requirements += [
        r
        for r in _grader_requirements(root, project, wanted) + _setuptools_requirements(hidden, wanted)
        if r not in core
    ]
    # pkg_resources is setuptools' (which a fresh environment lacks, and whose 81 drops it)
    if "pkg-resources" in {_canonical(name) for name in _test_imports(hidden)}:  # a conftest's too (pylama's)
        requirements.append("setuptools<81")
    # nor through the grader's own extras ("dev = ['stamina[tests]']" names the project itself)
    requirements = [r for r in requirements if _requirement_name(r) not in own]
    declared = {_requirement_name(r) for r in (*requirements, *pins)}
    requirements += [p for p in _addopts_plugins(hidden) if p not in declared]
    extra = EnvironmentSpec()
    if (root / "environment.toml").is_file():
        path = root / "environment.toml"
        data = _read_toml(path)
        _reject_unknown(path, data, _EnvironmentToml, "")
        if isinstance(data.get("environment"), dict):
            _reject_unknown(path, data["environment"], EnvironmentSpec, "environment.")
        extra = _convert(path, data, _EnvironmentToml).environment
        check_spec(extra, str(path))  # its own mistakes named by its own fields
    if not (pins or requirements or extra.pins or extra.requirements):
        return None
    # the benchmark's images (mid-2025) ran pytest 8: 9 refuses their conftests' py.path hook arguments (boltons,
    # docopt-ng), and a project's "pytest>=6" would resolve to it
    everything = (*requirements, *pins, *extra.requirements, *extra.pins)
    pytests = [r for r in everything if _requirement_name(r) == "pytest"]
    if not pytests:
        requirements.append("pytest>=8,<9")
    elif not any("==" in r for r in pytests):
        requirements.append("pytest<9")
    env = {"PYTHONPATH": "{workspace}"}  # the benchmark's images set PYTHONPATH=/workspace
    if _scm_versioned(hidden) and "PKG-INFO" not in hidden:
        # a version from git history (setuptools-scm, hatch-vcs), and a source without it (a git archive, a
        # checkout without .git): `pip install -e .` cannot build the project's metadata otherwise
        env["SETUPTOOLS_SCM_PRETEND_VERSION"] = "0.0.0"
    spec = EnvironmentSpec(
        pins=(*pins, *extra.pins),
        requirements=(*requirements, *extra.requirements),
        python=extra.python or python,
        env={**env, **extra.env},
    )
    check_spec(spec, str(root / "start.md"))
    return spec


def _scm_versioned(hidden: dict[str, FileData]) -> bool:
    """Whether the grader's packaging takes its version from version control (setuptools-scm, hatch-vcs)."""
    text = " ".join(str(hidden.get(name, "")) for name in ("pyproject.toml", "setup.py", "setup.cfg"))
    return bool(re.search(r"setuptools[_-]scm|hatch[_-]vcs|use_scm_version", text))


def _grader_requirements(root: Path, pyproject: str | None, wanted: Wanted) -> list[str]:
    """The dependencies the grader's ``pyproject.toml`` declares, with its test extras and dependency groups, and
    what its other extras and groups declare that ``wanted`` (extra, requirement) accepts."""
    if pyproject is None:
        return []
    try:
        data = tomllib.loads(pyproject)
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"{root}: the grader's pyproject.toml is not valid TOML: {e}") from None
    project = data.get("project", {})
    out = [r for r in project.get("dependencies", []) if isinstance(r, str)]
    # the build backend: `pip install -e .` runs offline without build isolation, so it must be in the environment
    build = data.get("build-system", {})
    out += [r for r in build.get("requires", []) if isinstance(r, str)]
    out += EDITABLE_NEEDS.get(build.get("build-backend", ""), [])
    extras = project.get("optional-dependencies", {})
    groups = data.get("dependency-groups", {})
    for name in ("test", "tests", "testing"):
        out += [r for r in extras.get(name, []) if isinstance(r, str)]
        out += [r for r in groups.get(name, []) if isinstance(r, str)]
    # another extra or group's requirement when the hidden tests name it: deepdiff's import uuid6, which only its
    # "dev" extra declares; stamina's parametrize anyio's backends with "trio"
    for name, listed in (*extras.items(), *groups.items()):
        if name not in _TEST_EXTRAS and isinstance(listed, list):
            out += [r for r in listed if isinstance(r, str) and wanted(name, r)]
    return out


def _requirement_name(requirement: str) -> str:
    return _canonical(re.split(r"[\[<>=!~;@ ]", requirement.strip(), maxsplit=1)[0])


_TEST_EXTRAS = ("test", "tests", "testing")
_DEV_EXTRAS = frozenset({"dev", "devel", "develop", "development", "all", "full"})
Wanted = Callable[[str, str], bool]  # (extra or group name, requirement) -> whether it joins the environment


def _no_other_extra(extra: str, requirement: str) -> bool:
    """The declared dependencies and test extras only."""
    return False


_SETUP_KEYWORDS = ("install_requires", "tests_require", "setup_requires")


def _setuptools_requirements(hidden: dict[str, FileData], wanted: Wanted) -> list[str]:
    """What a setuptools project of the grader's declares: ``setup.py``'s ``install_requires``, ``tests_require``,
    ``setup_requires`` and test extras where they are literal (read, never run), ``setup.cfg``'s ``[options]`` and
    test extras, other extras' requirements ``wanted`` accepts (pyjwt's "crypto" extra), and the lines
    of ``requirements.txt`` (a ``setup.py`` commonly reads it); setuptools itself when there is a ``setup.py`` (its
    ``pip install -e .`` runs offline, without build isolation)."""
    out: list[str] = []
    setup_py = hidden.get("setup.py")
    if isinstance(setup_py, str):
        out += ["setuptools", *_setup_py_requirements(setup_py, wanted)]
    setup_cfg = hidden.get("setup.cfg")
    if isinstance(setup_cfg, str):
        out += _setup_cfg_requirements(setup_cfg, wanted)
    for name in ("requirements.txt",):
        text = hidden.get(name)
        if isinstance(text, str) and isinstance(setup_py, str) and name in setup_py:
            out += _requirement_lines(text)
    return [
        r for r in out if _valid(r)
    ]  # a guess from files that are not requirement lists must not fail the load


def _valid(requirement: str) -> bool:
    """Whether ``requirement`` is a requirement specifier (setup.cfg's ``%(name)s`` interpolations are not)."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        Requirement(requirement)
    except InvalidRequirement:
        return False
    return True


def _requirement_lines(text: str) -> list[str]:
    """The requirements of a requirements file or a ``setup.cfg`` value: comments, options and blanks left out."""
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith(("-", "."))]


def _setup_py_requirements(source: str, wanted: Wanted) -> list[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    names: dict[str, ast.expr] = {}  # module-level NAME = literal, for install_requires=NAME
    for statement in tree.body:
        if (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
        ):
            names[statement.targets[0].id] = statement.value

    def strings(node: ast.expr | None) -> list[str]:
        if isinstance(node, ast.Name):
            node = names.get(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # DEPS + ["other"]
            return strings(node.left) + strings(node.right)
        if isinstance(node, ast.List | ast.Tuple):
            return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return _requirement_lines(node.value)
        return []

    out: list[str] = []
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        for keyword in call.keywords:
            if keyword.arg in _SETUP_KEYWORDS:
                out += strings(keyword.value)
            elif keyword.arg == "extras_require":
                extras = names.get(keyword.value.id) if isinstance(keyword.value, ast.Name) else keyword.value
                if isinstance(extras, ast.Dict):
                    for key, value in zip(extras.keys, extras.values, strict=True):
                        if isinstance(key, ast.Constant) and key.value in _TEST_EXTRAS:
                            out += strings(value)
                        elif isinstance(key, ast.Constant) and isinstance(key.value, str):
                            out += [r for r in strings(value) if wanted(key.value, r)]
    return out


def _setup_cfg_requirements(text: str, wanted: Wanted) -> list[str]:
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return []
    out: list[str] = []
    for key in _SETUP_KEYWORDS:
        out += _requirement_lines(parser.get("options", key, fallback=""))
    for extra, value in (
        parser.items("options.extras_require") if parser.has_section("options.extras_require") else ()
    ):
        lines = _requirement_lines(value)
        out += lines if extra in _TEST_EXTRAS else [r for r in lines if wanted(extra, r)]
    return out


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def _project_names(hidden: dict[str, FileData]) -> list[str]:
    """The distribution names the grader's packaging declares (pyproject's [project] name, setup.py's name=)."""
    names = []
    pyproject = hidden.get("pyproject.toml")
    if isinstance(pyproject, str):
        with contextlib.suppress(tomllib.TOMLDecodeError):
            name = tomllib.loads(pyproject).get("project", {}).get("name")
            names += [name] if isinstance(name, str) else []
    for file in ("setup.py", "setup.cfg"):
        text = hidden.get(file)
        if isinstance(text, str):
            names += re.findall(r"""\bname\s*[=:]\s*["']?([A-Za-z0-9][A-Za-z0-9._-]*)""", text)
    return names


class _EnvironmentToml(msgspec.Struct):
    environment: EnvironmentSpec = msgspec.field(default_factory=EnvironmentSpec)


# --- Harbor ----------------------------------------------------------------------------------------------------------


class _HarborTimeout(msgspec.Struct):
    timeout_sec: Seconds | None = None


class _HarborVerifier(msgspec.Struct):
    timeout_sec: Seconds | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)


class _HarborEnvironment(msgspec.Struct):
    docker_image: str | None = None
    image: str | None = None  # the same request under its other common name
    cpus: Annotated[float, msgspec.Meta(gt=0)] | None = None
    memory_mb: Annotated[int, msgspec.Meta(gt=0)] | None = None


class _HarborToml(msgspec.Struct):
    """The parts of a Harbor ``task.toml`` Gyre reads; other keys are ignored."""

    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    verifier: _HarborVerifier = msgspec.field(default_factory=_HarborVerifier)
    agent: _HarborTimeout = msgspec.field(default_factory=_HarborTimeout)
    environment: _HarborEnvironment = msgspec.field(default_factory=_HarborEnvironment)


def _load_harbor(root: Path) -> Task:
    toml_path = root / "task.toml"
    spec = _convert(toml_path, _read_toml(toml_path), _HarborToml)
    unsupported = None
    image = spec.environment.docker_image or spec.environment.image
    if image and (problem := image_problem(image)):
        unsupported = f"it needs the container image {image!r} (task.toml [environment]), {problem}"
    verifier = VerifierSpec(
        commands=(HARBOR_TEST_COMMAND,),
        result="reward_file",
        report_path=HARBOR_REWARD_PATH,
        timeout_s=spec.verifier.timeout_sec or 600.0,
        env=spec.verifier.env,
    )
    metadata = {k: v for k, v in spec.metadata.items() if isinstance(v, str)}
    solution = _read_tree(root / "solution", prefix="solution/")
    if solution and "solution/solve.sh" not in solution:
        raise TaskError(
            f"{root / 'solution'}: field 'solve.sh': a Harbor solution is run as solution/solve.sh"
        )
    return Task(
        id=root.name,
        instruction=_read_instruction(root / "instruction.md"),
        time_budget_s=spec.agent.timeout_sec or 3600.0,
        metadata=metadata,
        format="harbor",
        hidden_files=_read_tree(root / "tests", prefix="tests/"),
        verifier=verifier,
        limits=TaskLimits(memory_mb=spec.environment.memory_mb, cpus=spec.environment.cpus),
        source_dir=str(root.resolve()),
        unsupported=unsupported,
        solution_files=solution,
        solution_command=HARBOR_SOLVE_COMMAND if solution else None,
        image=image or None,
    )


# --- helpers ---------------------------------------------------------------------------------------------------------


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskError(f"{path}: file not found") from None
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise TaskError(f"{path}: cannot read ({e.strerror})") from None


def _read_instruction(path: Path) -> str:
    text = _read_text(path)
    if not text.strip():
        raise TaskError(f"{path}: field 'instruction': the file is empty")
    return text


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(_read_text(path))
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"{path}: invalid TOML: {e}") from None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise TaskError(f"{path}: invalid JSON: {e}") from None


def _read_tree(directory: Path, *, prefix: str) -> dict[str, FileData]:
    """Every file under ``directory`` as ``prefix + relative posix path -> contents`` (text, or bytes when it is not
    UTF-8); {} when it does not exist."""
    if not directory.is_dir():
        return {}
    return {
        prefix + p.relative_to(directory).as_posix(): _read_data(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def _read_data(path: Path) -> FileData:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TaskError(f"{path}: cannot read ({e.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def _check_relative(where: str, rel: object) -> None:
    if not isinstance(rel, str) or not rel:
        raise TaskError(f"{where}: expected a relative path string, got {rel!r}")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts:
        raise TaskError(f"{where}: path {rel!r} must stay inside the task directory")


def _check_verifier(path: Path, verifier: VerifierSpec) -> None:
    if not verifier.commands:
        raise TaskError(f"{path}: field 'verifier.commands': must list at least one shell command")
    for i, command in enumerate(verifier.commands):
        if not command.strip():
            raise TaskError(f"{path}: field 'verifier.commands[{i}]': empty command")
    if verifier.result == "reward_file" and not verifier.report_path:
        raise TaskError(f"{path}: field 'verifier.report_path': required when result = {verifier.result!r}")


def _reject_unknown(path: Path, table: dict[str, Any], struct: type[msgspec.Struct], prefix: str) -> None:
    unknown = sorted(set(table) - set(struct.__struct_fields__))
    if unknown:
        allowed = ", ".join(struct.__struct_fields__)
        raise TaskError(f"{path}: field '{prefix}{unknown[0]}': unknown field (expected one of: {allowed})")


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$")


def _convert(path: Path, data: dict[str, Any], struct: type[S]) -> S:
    """``data`` as ``struct``, or a `TaskError` naming the file and the offending field."""
    try:
        return msgspec.convert(data, struct)
    except msgspec.ValidationError as e:
        raise TaskError(_field_error(path, str(e))) from None


def _field_error(path: Path, message: str) -> str:
    match = _AT.match(message)
    assert match is not None  # the pattern matches any string
    msg, field = match["msg"], (match["path"] or "").lstrip(".")
    missing = re.fullmatch(r"Object missing required field `(\w+)`", msg)
    if missing:
        field = f"{field}.{missing[1]}" if field else missing[1]
        msg = "missing required field"
    if field.endswith("result") and msg.startswith("Invalid enum value"):
        msg += " (expected 'junit', 'reward_file' or 'exit_code')"
    return f"{path}: field '{field or '(top level)'}': {msg}"

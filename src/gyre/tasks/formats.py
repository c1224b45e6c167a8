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

import json
import re
import tomllib
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from gyre.errors import TaskError
from gyre.sandbox.container import image_problem
from gyre.tasks.base import Task, TaskLimits, VerifierSpec

Format = Literal["gyre", "nl2repo", "harbor"]
S = TypeVar("S", bound=msgspec.Struct)
Seconds = Annotated[float, msgspec.Meta(gt=0)]

# What the NL2RepoBench grader replaces with its own copies, or what would let an agent steer pytest: removed from
# the graded workspace. Packaging files only when the task ships its own (else `pip install -e .` needs the agent's).
NL2REPO_PACKAGING = ("pyproject.toml", "setup.py", "setup.cfg")
NL2REPO_PYTEST_CONFIG = ("**/conftest.py", "pytest.ini", "tox.ini")
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
    expert: str | None = None  # a scripted expert that solves it (gyre.tasks.experts)


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
    hidden: dict[str, str] = {}
    missing: list[str] = []
    for i, rel in enumerate(test_files):
        where = f"{root / 'test_files.json'}: field 'test_files[{i}]'"
        _check_relative(where, rel)
        if (root / rel).is_file():  # shipped next to the spec (e.g. Gyre's own suites)
            hidden[rel] = _read_text(root / rel)
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
    ships_packaging = any(p in NL2REPO_PACKAGING for p in test_files)
    verifier = VerifierSpec(
        commands=tuple(commands),
        result="junit",  # pytest reports through PYTEST_ADDOPTS: the commands stay verbatim
        declared_test_count=int(raw),
        remove=(NL2REPO_PACKAGING if ships_packaging else ()) + NL2REPO_PYTEST_CONFIG,
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
    )


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


def _read_tree(directory: Path, *, prefix: str) -> dict[str, str]:
    """Every file under ``directory`` as ``prefix + relative posix path -> text``; {} when it does not exist."""
    if not directory.is_dir():
        return {}
    return {
        prefix + p.relative_to(directory).as_posix(): _read_text(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


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

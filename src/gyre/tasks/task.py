"""The task an execution attempts: an instruction, a starting workspace and a time budget."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

ResultKind = Literal["junit", "reward_file", "exit_code"]
FileData = (
    str | bytes
)  # a task file's contents: text, or bytes when it is not UTF-8 (compiled catalogues, images)


class VerifierSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How a finished workspace is scored: shell commands run in it, then one artifact read."""

    commands: tuple[str, ...]  # shell strings run in order in the workspace root; never split on spaces
    result: ResultKind = (
        "exit_code"  # junit: passed tests from a JUnit XML report; reward_file: a float in a file
    )
    report_path: str = (
        ""  # reward file or JUnit report; workspace-relative unless absolute; junit "": pytest's
    )
    declared_test_count: Annotated[int, msgspec.Meta(ge=0)] | None = None  # score = min(passed / declared, 1)
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 600.0  # wall clock for all the commands together
    env: dict[str, str] = msgspec.field(default_factory=dict)  # extra environment for the commands
    remove: tuple[str, ...] = ()  # workspace paths deleted before grading ("**/name": at any depth)
    # pytest plugins the hidden tests need, loaded with -p (plugin autoload is off while grading); JUnit only
    pytest_plugins: tuple[str, ...] = ()


class EnvironmentSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The Python packages a task's commands need (the agent's and the verifier's), prepared once on the host
    (`gyre tasks prepare`, `gyre.tasks.environments`) and shown read-only to its sandboxes."""

    # exact versions of a complete environment (an NL2RepoBench spec's freeze list): installed as they are, no
    # dependency resolution, the way the benchmark's image was built
    pins: tuple[str, ...] = ()
    requirements: tuple[
        str, ...
    ] = ()  # requirement strings resolved on top of the pins (a grader's test deps)
    python: str | None = (
        None  # the version the task names; the host's Python runs it (a mismatch is recorded)
    )
    env: dict[str, str] = msgspec.field(
        default_factory=dict
    )  # variables for its commands (agent and verifier)


class TaskLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Resource limits a task asks for; None leaves the runtime's default."""

    max_turns: Annotated[int, msgspec.Meta(gt=0)] | None = None  # agent model calls in one execution
    memory_mb: Annotated[int, msgspec.Meta(gt=0)] | None = None  # sandbox memory
    cpus: Annotated[float, msgspec.Meta(gt=0)] | None = None  # sandbox CPU share


class Task(msgspec.Struct, frozen=True, kw_only=True):
    """One problem. ``files`` are written into the workspace before the agent starts."""

    id: str
    instruction: str
    files: dict[str, FileData] = msgspec.field(default_factory=dict)  # workspace-relative path -> contents
    time_budget_s: Annotated[float, msgspec.Meta(gt=0)] = 3600.0  # wall clock for one execution
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    format: Literal["gyre", "nl2repo", "harbor"] = "gyre"  # the directory layout it was loaded from
    hidden_files: dict[str, FileData] = msgspec.field(
        default_factory=dict
    )  # never shown to the agent; verify only
    missing_hidden_files: tuple[str, ...] = ()  # hidden test paths the task names but does not ship
    verifier: VerifierSpec | None = None  # None: nothing scores this task
    limits: TaskLimits = msgspec.field(default_factory=TaskLimits)
    environment: EnvironmentSpec | None = None  # None: commands see the driver's Python (read-only)
    source_dir: str = ""  # absolute path of the task directory; "" when built in code
    unsupported: str | None = (
        None  # why this host cannot run it (e.g. needs a container image); None: runnable
    )
    solution_files: dict[str, FileData] = msgspec.field(
        default_factory=dict
    )  # a reference solution (workspace path -> text): `--agent oracle` writes it, the agent never sees it
    expert: str | None = (
        None  # the scripted expert that solves it (a name in gyre.tasks.catalog.EXPERTS), if any
    )
    solution_command: str | None = (
        None  # run after the solution files are written (Harbor: solution/solve.sh)
    )
    image: str | None = None  # the container image its commands run in (Harbor's docker_image); None: none

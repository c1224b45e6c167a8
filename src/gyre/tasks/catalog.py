"""Suites shipped inside the package, suite lookup by name or path, and the scripted experts by name.

- ``toy`` (`gyre.tasks.toy`): generated file-chain tasks; ``toy:N`` has N tasks, ``toy:N:SEED`` another fixed set.
- ``long`` (`gyre.tasks.long`): generated CI-pipeline tasks of hundreds of calls and 100K+ tokens;
  ``long:N[:SEED[:STAGES]]``.
- ``nl2repo-mini``: NL2RepoBench-style library tasks with hidden pytest suites and reference solutions
  (``gyre/tasks/suites/nl2repo-mini/``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gyre.errors import TaskError
from gyre.tasks import long, toy
from gyre.tasks.formats import detect_format, load_suite, load_task
from gyre.tasks.task import Task

SUITES_DIR = Path(__file__).parent / "suites"
BUILTIN_SUITES = ("toy", "long", "nl2repo-mini")

Expert = Callable[[str], str]  # the rendered prompt -> the expert's assistant message
EXPERTS: dict[str, Expert] = {
    "toy-chain": toy.expert_reply,
    "toy-chain-impatient": toy.impatient_reply,
    "long-pipeline": long.expert_reply,
}


def resolve_suite(spec: str) -> list[Task]:
    """The tasks of a built-in suite (``toy``, ``toy:N[:SEED]``, ``long:N[:SEED[:STAGES]]``, ``nl2repo-mini``), a
    suite directory or one task."""
    name, _, rest = spec.partition(":")
    if name == "toy":
        try:
            count, seed = ([int(x) for x in rest.split(":")] + [0])[:2] if rest else (64, 0)
        except ValueError:
            raise TaskError(f"suite {spec!r}: expected toy, toy:COUNT or toy:COUNT:SEED") from None
        if count < 1:
            raise TaskError(f"suite {spec!r}: COUNT must be at least 1")
        return toy.toy_suite(count, seed)
    if name == "long":
        try:
            count, seed, stages = ([int(x) for x in rest.split(":")] + [0, 0])[:3] if rest else (8, 0, 0)
        except ValueError:
            raise TaskError(
                f"suite {spec!r}: expected long, long:COUNT, long:COUNT:SEED or long:COUNT:SEED:STAGES"
            ) from None
        if count < 1 or stages < 0:
            raise TaskError(f"suite {spec!r}: COUNT must be at least 1 and STAGES (0: full size) at least 0")
        return long.long_suite(count, seed, stages or None)
    if spec in BUILTIN_SUITES:
        return load_suite(SUITES_DIR / spec)
    path = Path(spec)
    if not path.exists():
        raise TaskError(
            f"suite {spec!r}: neither a built-in suite ({', '.join(BUILTIN_SUITES)}) nor an existing directory"
        )
    try:
        detect_format(path)
    except TaskError:
        return load_suite(path)  # not a task itself: a directory of tasks
    return [load_task(path)]


def expert(name: str) -> Expert:
    """The scripted expert called ``name``."""
    try:
        return EXPERTS[name]
    except KeyError:
        raise TaskError(f"no scripted expert {name!r} (known: {', '.join(sorted(EXPERTS))})") from None

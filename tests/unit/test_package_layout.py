"""The package's layout: the root holds only its entry points, and a module's name says which module it is."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import gyre

SRC = Path(gyre.__file__).parent
ENTRY_POINTS = {"__init__", "__main__", "config", "errors", "protocol"}  # and the package gyre.cli


def _modules() -> list[Path]:
    """Every module and package of gyre; task suites are data (the code agents are graded against), not gyre's."""
    found = [
        p for p in SRC.rglob("*.py") if "suites" not in p.relative_to(SRC).parts and p != SRC / "__init__.py"
    ]
    return [p.parent if p.name == "__init__.py" else p for p in found]


def test_the_root_holds_only_entry_points() -> None:
    loose = {p.stem for p in SRC.glob("*.py")}
    assert loose == ENTRY_POINTS, f"loose at the root: {sorted(loose - ENTRY_POINTS)}"
    from gyre.cli import main

    assert main.__module__ == "gyre.cli"  # the console script's target, `gyre = "gyre.cli:main"`


def test_no_two_modules_share_a_name() -> None:
    names = Counter(p.stem if p.suffix else p.name for p in _modules())
    shared = {name for name, count in names.items() if count > 1}
    assert not shared, (
        f"modules sharing a name (each says which it is: gyre.train.coretrainer, not core): {sorted(shared)}"
    )


def test_every_public_name_imports_from_where_it_lives() -> None:
    for name in gyre.__all__:
        assert getattr(gyre, name).__name__ == name

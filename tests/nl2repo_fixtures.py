"""The five real NL2RepoBench fixture tasks (``tests/data/nl2repobench``) and what tests do to their references."""

from __future__ import annotations

import ast
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "data" / "nl2repobench"
# task -> (solution file, the function or method taken out: "Class.method" or "function")
REMOVED = {
    "retrying": ("retrying.py", "Retrying.incrementing_sleep"),
    "parse": ("parse.py", "findall"),
    "humanize": ("src/humanize/filesize.py", "naturalsize"),
    "stamina": ("src/stamina/_core.py", "Attempt.next_wait"),
    "docopt-ng": ("docopt/__init__.py", "_levenshtein_norm"),
}


def without(source: str, qualname: str) -> str:
    """``source`` with the body of ``qualname`` (a function, or ``Class.method``) replaced by ``raise
    NotImplementedError``: the one function an agent left unwritten (the module still imports)."""
    lines = source.splitlines(keepends=True)
    nodes: list[ast.stmt] = ast.parse(source).body
    *owners, name = qualname.split(".")
    for owner in owners:
        nodes = next(n for n in nodes if isinstance(n, ast.ClassDef) and n.name == owner).body
    node = next(n for n in nodes if isinstance(n, ast.FunctionDef) and n.name == name)
    body = node.body[0]
    first = body.lineno - 1
    indent = " " * body.col_offset
    assert node.end_lineno is not None
    return "".join([*lines[:first], f"{indent}raise NotImplementedError\n", *lines[node.end_lineno :]])


def write_tree(root: Path, files: dict[str, str | bytes]) -> Path:
    root.mkdir()
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return root

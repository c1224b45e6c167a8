"""MkDocs hooks: pages generated at build time from the code, so they cannot drift from it.

- ``<!-- gyre:config-reference -->`` in a page becomes the configuration reference: every key of every section of
  `gyre.config.GyreConfig` (dotted, as ``--set`` takes it), its type and bounds, its default, and the comment beside it
  in ``src/gyre/config.py``, read with `ast` and `tokenize` (msgspec gives the types and defaults).
- ``<!-- gyre:benchmarks -->`` becomes BENCHMARKS.md (the repository's page of current figures), its links made to
  work from inside the manual.
- ``<!-- gyre:python-api -->`` becomes one mkdocstrings block per public name of `gyre` (its ``_LAZY`` table: the
  module each name really lives in, so a module that moves moves here too).

`config_reference()` and `config_keys()` are plain functions: tests/unit/test_docs.py calls them without MkDocs.
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import tokenize
import typing
from pathlib import Path
from typing import Any, Literal

import msgspec

CONFIG_MARKER = "<!-- gyre:config-reference -->"
API_MARKER = "<!-- gyre:python-api -->"
BENCHMARKS_MARKER = "<!-- gyre:benchmarks -->"
ROOT = Path(__file__).resolve().parent.parent
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def _struct_type(tp: Any) -> type[msgspec.Struct] | None:
    return tp if isinstance(tp, type) and issubclass(tp, msgspec.Struct) else None


def _field_comments(cls: type) -> dict[str, str]:
    """Each field's comment in the class's source: the comment lines just above it, then any on its own lines.

    A comment block above a field covers the fields that follow it without a blank line or comment of their own
    (``probe_timeout_s`` and ``hung_after_s`` share one)."""
    lines, _ = inspect.getsourcelines(cls)
    source = "".join(lines)
    comments: dict[int, str] = {}  # line number (1-based within the class source) -> comment text
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    body = ast.parse(source).body[0]  # config Structs are top-level classes: no indentation to strip
    assert isinstance(body, ast.ClassDef)
    result: dict[str, str] = {}
    previous_end = body.lineno
    inherited = ""
    for node in body.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            end = node.end_lineno or node.lineno
            above: list[str] = []
            line = node.lineno - 1
            while line > previous_end and line in comments and lines[line - 1].lstrip().startswith("#"):
                above.insert(0, comments[line])
                line -= 1
            gap = any(not lines[n - 1].strip() for n in range(previous_end + 1, node.lineno))
            own = [comments[n] for n in range(node.lineno, end + 1) if n in comments]
            block = " ".join(above)
            if block:
                inherited = block
            elif gap or own:
                inherited = ""
            text = "; ".join(part for part in (block or inherited, " ".join(own)) if part)
            result[node.target.id] = text
        previous_end = node.end_lineno or node.lineno
    return result


def _type_text(info: Any, annotation: Any = None) -> str:
    """A msgspec type as a reader writes it in TOML terms, bounds included (``int >= 1``)."""
    mi = msgspec.inspect
    if typing.get_origin(annotation) is Literal:  # in the source's order (msgspec sorts them)
        return " | ".join(_literal(v) for v in typing.get_args(annotation))
    if isinstance(info, mi.UnionType):
        return " | ".join(_type_text(t) for t in info.types)
    if isinstance(info, mi.LiteralType):
        return " | ".join(_literal(v) for v in info.values)
    if isinstance(info, mi.ListType):
        item = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else None
        return f"list[{_type_text(info.item_type, item)}]"
    if isinstance(info, mi.DictType):
        return f"table[{_type_text(info.key_type)}, {_type_text(info.value_type)}]"
    names = {
        mi.IntType: "int",
        mi.FloatType: "float",
        mi.StrType: "str",
        mi.BoolType: "bool",
        mi.NoneType: "none",
    }
    name = names.get(type(info), type(info).__name__.removesuffix("Type").lower())
    bounds = []
    for attr, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        value = getattr(info, attr, None)
        if value is not None:
            bounds.append(f"{op} {value}")
    return f"{name} {', '.join(bounds)}" if bounds else name


def _literal(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _default_text(field: msgspec.structs.FieldInfo) -> str:
    if field.default is not msgspec.NODEFAULT:
        value = field.default
    elif field.default_factory is not msgspec.NODEFAULT:
        value = field.default_factory()
    else:
        return "(required)"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | list | dict):
        return msgspec.json.encode(value).decode().replace(",", ", ").replace(":", ": ")
    return repr(value)


def _cell(text: str) -> str:
    """Table-cell text: pipes escaped, angle brackets kept as text."""
    return text.replace("|", "\\|").replace("<", "&lt;")


def config_keys(
    root: type | None = None, prefix: str = ""
) -> list[tuple[str, msgspec.structs.FieldInfo, type]]:
    """Every leaf key reachable from the root Struct (default `GyreConfig`): (dotted key, field, owning Struct)."""
    if root is None:
        from gyre.config import GyreConfig

        root = GyreConfig
    keys = []
    for field in msgspec.structs.fields(root):
        key = f"{prefix}{field.name}"
        sub = _struct_type(field.type)
        if sub is not None:
            keys.extend(config_keys(sub, f"{key}."))
        else:
            keys.append((key, field, root))
    return keys


def config_reference() -> str:
    """The configuration reference as Markdown: one table per section, in the order of `GyreConfig`'s fields."""
    from gyre.config import GyreConfig

    out: list[str] = []

    def section(cls: type, name: str, level: int) -> None:
        doc = inspect.cleandoc(cls.__doc__ or "")
        comments = _field_comments(cls)
        leaves = [f for f in msgspec.structs.fields(cls) if _struct_type(f.type) is None]
        out.append(f"{'#' * level} `[{name}]`\n")
        out.append(f"`{cls.__module__}.{cls.__name__}`: {doc}\n" if doc else f"`{cls.__name__}`\n")
        if leaves:
            out.append("| key | type | default | what it is |\n|---|---|---|---|")
            for field in leaves:
                kind = _type_text(msgspec.inspect.type_info(field.type), field.type)
                out.append(
                    f"| `{name}.{field.name}` | {_cell(kind)} | `{_cell(_default_text(field))}` "
                    f"| {_cell(comments.get(field.name, ''))} |"
                )
            out.append("")
        for field in msgspec.structs.fields(cls):
            sub = _struct_type(field.type)
            if sub is not None:
                section(sub, f"{name}.{field.name}", level + 1)

    for field in msgspec.structs.fields(GyreConfig):
        sub = _struct_type(field.type)
        assert sub is not None, f"GyreConfig.{field.name} is not a section"
        section(sub, field.name, 2)
    return "\n".join(out)


def python_api() -> str:
    """One mkdocstrings block per public name of `gyre`, from the module it lives in."""
    import gyre

    table: dict[str, str] = gyre._LAZY
    blocks = []
    for name in sorted(table, key=str.lower):
        blocks.append(
            f"## `gyre.{name}`\n\n::: {table[name]}.{name}\n    options:\n      show_root_heading: false\n"
        )
    return "\n".join(blocks)


def benchmarks_page() -> str:
    """BENCHMARKS.md without its title, as a page of the manual: links into docs/ made relative to it, links to
    other files of the repository (outside the manual) kept as their text."""

    def link(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if target.startswith(("#", "http://", "https://", "mailto:")):
            return match.group(0)
        if target.startswith("docs/"):
            return f"[{text}]({target.removeprefix('docs/')})"
        return text

    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return _LINK.sub(link, "\n".join(lines))


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Fill the markers of generated pages."""
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_reference())
    if BENCHMARKS_MARKER in markdown:
        markdown = markdown.replace(BENCHMARKS_MARKER, benchmarks_page())
    if API_MARKER in markdown:
        markdown = markdown.replace(API_MARKER, python_api())
    return markdown

"""The manual cannot drift: every configuration key is in the generated reference, and the README stays a short
front door whose links all resolve. The generator (docs/hooks.py) is called directly: no mkdocs build here."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import msgspec

from gyre.config import GyreConfig

ROOT = Path(__file__).resolve().parents[2]


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gyre_docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _keys(struct: type, prefix: str = "") -> list[str]:
    """Every leaf key reachable from a config Struct, dotted as `--set` takes it (walked here, not by the generator)."""
    keys = []
    for field in msgspec.structs.fields(struct):
        if isinstance(field.type, type) and issubclass(field.type, msgspec.Struct):
            keys += _keys(field.type, f"{prefix}{field.name}.")
        else:
            keys.append(f"{prefix}{field.name}")
    return keys


def test_every_config_key_is_in_the_reference_with_its_default_and_comment() -> None:
    reference = _hooks().config_reference()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z0-9_.]+)` \|.*$", reference, re.M)}
    keys = _keys(GyreConfig)
    assert len(keys) > 150 and "trainer.loss.clip_low" in keys and "trainer.ranks" in keys
    missing = [key for key in keys if key not in rows]
    assert not missing, f"config keys missing from the generated reference: {missing}"
    # each row carries the type, the default and the comment beside the field in src/gyre/config.py
    assert "| int > 0 | `1` | the core cell's data-parallel ranks" in rows["trainer.ranks"]
    assert '| "tree" \\| "path" | `"tree"` |' in rows["trajectory.packing"]
    assert "fsync every record" in rows["router.journal_fsync"]
    # a comment block above two fields documents both
    assert (
        "hung_after_s is hung" in rows["router.probe_timeout_s"]
        and "hung_after_s is hung" in rows["router.hung_after_s"]
    )


def test_the_reference_page_and_the_api_page_hold_their_markers() -> None:
    hooks = _hooks()
    assert hooks.CONFIG_MARKER in (ROOT / "docs/reference/configuration.md").read_text()
    assert hooks.API_MARKER in (ROOT / "docs/reference/python-api.md").read_text()
    import gyre

    api = hooks.python_api()
    assert all(f"::: {module}.{name}" in api for name, module in gyre._LAZY.items())


def test_readme_is_short_and_its_relative_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    relative = [t for t in targets if not t.startswith(("http://", "https://", "mailto:", "#"))]
    assert any(t.startswith("docs/") for t in relative)
    broken = [t for t in relative if not (ROOT / t.split("#")[0]).exists()]
    assert not broken, f"README links to files that do not exist: {broken}"


def test_every_manual_page_in_the_nav_exists() -> None:
    nav = re.findall(r":\s*([\w/-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert "reference/configuration.md" in nav and "benchmarks-history.md" in nav
    missing = [page for page in nav if not (ROOT / "docs" / page).exists()]
    assert not missing, f"mkdocs.yml's nav names pages docs/ lacks: {missing}"

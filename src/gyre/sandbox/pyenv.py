"""A prepared Python environment shown read-only to a sandbox, under a writable layer of the sandbox's own.

A task's environment (`gyre.tasks.environments`) is a virtual environment on the host, built once and shared by
every execution that needs the same packages. A sandbox sees it read-only at its host path (its scripts name that
path) and runs over it a *layer*: a tiny virtual environment in the sandbox's ``/tmp`` whose interpreter is the same
base Python, whose ``site-packages`` comes first and is writable, and which adds the shared environment's
``site-packages`` behind its own (``_gyre_env.pth``). So ``pip install -e .`` inside the sandbox installs the
agent's package into that sandbox's layer, resolving every dependency from the shared environment without a
network (``PIP_NO_INDEX``; build backends from the environment, no build isolation), and never touches what other
executions share. The shared environment's console scripts (``pytest``, ``pip``, ...) are copied into the layer's
``bin`` with their interpreter line pointing at the layer, so they see the layer too.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

LAYER_NAME = ".gyre-python"  # in the sandbox's /tmp
PTH_NAME = "_gyre_env.pth"
_SHEBANG_LINES = (
    3  # where an interpreter path may be named: `#!...`, or a `#!/bin/sh` + `'''exec' ...` trampoline
)


def site_packages(prefix: str | Path) -> str:
    """The ``site-packages`` directory of a virtual environment made by this host's Python."""
    return f"{prefix}/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"


def base_interpreter(env: Path) -> Path:
    """The base Python an environment runs (its ``bin/python`` resolved)."""
    return (env / "bin" / "python").resolve()


def base_prefix(env: Path) -> str:
    """The base Python's installation prefix (``home`` of ``pyvenv.cfg`` is its ``bin``): a sandbox must see it."""
    return str(base_interpreter(env).parent.parent)


def make_layer(env: Path, layer: Path, shown_layer: str) -> None:
    """Write the layer of ``env`` into the host directory ``layer``, which commands see at ``shown_layer`` (see the
    module; blocking). ``env`` is shown at its own path."""
    interpreter = base_interpreter(env)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    (layer / "bin").mkdir(parents=True)
    site = Path(site_packages(layer))
    site.mkdir(parents=True)
    (layer / "pyvenv.cfg").write_text(
        f"home = {interpreter.parent}\ninclude-system-site-packages = false\n"
        f"version = {'.'.join(map(str, sys.version_info[:3]))}\n"
    )
    for name in ("python", "python3", f"python{version}"):
        (layer / "bin" / name).symlink_to(interpreter)
    # addsitedir, not a bare path: the shared environment's own .pth files (setuptools' and editable installs') run
    (site / PTH_NAME).write_text(f"import site; site.addsitedir({site_packages(env)!r})\n")
    old, new = f"{env}/bin/python", f"{shown_layer}/bin/python"
    for script in sorted((env / "bin").iterdir()):
        if script.name.startswith(("python", "activate", "Activate")) or not script.is_file():
            continue
        data = script.read_bytes()
        parts = data.split(b"\n", _SHEBANG_LINES)  # the first lines, then the rest
        head = parts[:_SHEBANG_LINES]
        if not data.startswith(b"#!") or not any(old.encode() in line for line in head):
            continue  # not a Python console script of this environment: left to the shared bin
        head = [line.replace(old.encode(), new.encode()) for line in head]
        target = layer / "bin" / script.name
        target.write_bytes(b"\n".join(head + parts[_SHEBANG_LINES:]))
        target.chmod(0o755)


def layer_environment(env: Path, shown_layer: str, system_path: str) -> dict[str, str]:
    """The variables commands run with over a layer: its ``bin`` first on PATH, pip offline and without build
    isolation (build backends come from the environment), no host pip configuration."""
    return {
        "VIRTUAL_ENV": shown_layer,
        "PATH": f"{shown_layer}/bin:{env}/bin:{system_path}",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_NO_BUILD_ISOLATION": "0",  # pip's inverted switch: "0" turns build isolation off
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
        "PIP_ROOT_USER_ACTION": "ignore",
    }

"""The graded commands' ``pytest``: a start-up in which nothing of the agent's runs before the grader plugin.

Not imported by Gyre itself: the verifier copies this file into the read-only grader directory's ``bin/`` as
``pytest``, ``py.test``, ``python`` and ``python3``, first on the commands' PATH, each with an interpreter line naming
the trusted base Python with ``-I -S``. So no ``site`` processing (no ``.pth`` file, ``sitecustomize`` or
``usercustomize`` runs), no ``PYTHON*`` variable of the command's is read, and neither the working directory nor the
script's is on ``sys.path``. Then, before any import beyond the standard library:

- it reads the command's key from its FIFO; a key already gone (something else of this command read it first) is
  reported on the report FIFO as ``key-taken``, which the host judges tampering;
- it builds ``sys.path``: the grader directory, the standard library, the task's prepared environment (read-only;
  its own ``.pth`` files, which the host built, are processed), and behind them the sandbox's writable layer as plain
  directories (what the command's install step put there can add packages but shadow none, and the code lines of
  its ``.pth`` files never run; the grader plugin adds the workspace itself);
- it sets pytest's options and the grader's variables from the grader's configuration, whatever the environment
  says, and runs pytest in this process; the grader plugin takes the key from it.

Invoked as ``python`` (or ``python3``) without ``-m pytest``, it hands over to the interpreter the command would
otherwise have found on its PATH. A pytest started under a graded one (its tests running pytest) inherits
``GYRE_GRADER_INSIDE`` and runs without a key, silent, as before. Depends on nothing but the standard library.
"""

from __future__ import annotations

import json
import os
import sys

GRADER = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY_BYTES = 32
INSIDE = "GYRE_GRADER_INSIDE"
PYTEST_NAMES = ("pytest", "py.test")
_TAKES_VALUE = ("-W", "-X", "-Q")  # interpreter options followed by a value


def _pytest_args(name: str, args: list[str]) -> list[str] | None:
    """pytest's arguments, or None when this is not a pytest run (``python`` running something else)."""
    if name in PYTEST_NAMES:
        return args
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-m":
            return args[i + 2 :] if i + 1 < len(args) and args[i + 1] in PYTEST_NAMES else None
        if arg.startswith("-m"):
            return args[i + 1 :] if arg[2:] in PYTEST_NAMES else None
        if not arg.startswith("-") or arg in ("-", "-c") or arg.startswith("-c"):
            return None  # a script, code, or standard input
        i += 2 if arg in _TAKES_VALUE else 1
    return None


def _hand_over(name: str, args: list[str]) -> None:
    """Run the ``name`` the command would have found without the grader's ``bin/``."""
    ours = os.path.realpath(os.path.join(GRADER, "bin"))
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not directory or os.path.realpath(directory) == ours:
            continue
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            os.execv(candidate, [candidate, *args])  # its path as argv[0], as a shell would have run it
    sys.stderr.write(f"{name}: command not found\n")
    sys.exit(127)


def _take_key() -> bytes | None:
    """This command's key; None when the command has no channel (a nested run, or no grading)."""
    path = os.environ.get("GYRE_GRADER_KEY", "")
    if not path or INSIDE in os.environ:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        key = os.read(fd, KEY_BYTES)
    except BlockingIOError:
        key = b""
    finally:
        os.close(fd)
    return key if len(key) == KEY_BYTES else b""


def _report_taken() -> None:
    """Say on the report FIFO, unauthenticated (there is no key to sign with), that the key was taken."""
    path = os.environ.get("GYRE_GRADER_REPORT", "")
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        os.write(fd, b"key-taken\n")
    finally:
        os.close(fd)


def _add_plain(directory: str) -> None:
    """``directory`` and the directories its ``.pth`` files name, behind everything; their code lines never run."""
    if not os.path.isdir(directory):
        return
    sys.path.append(directory)
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".pth"):
            continue
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            line = line.strip()
            if not line or line.startswith(("#", "import ", "import\t")):
                continue
            path = os.path.normpath(os.path.join(directory, line))
            if os.path.isdir(path) and path not in sys.path:
                sys.path.append(path)


def main() -> None:
    name = os.path.basename(sys.argv[0])
    args = sys.argv[1:]
    graded = _pytest_args(name, args)
    if graded is None:
        _hand_over(name, args)
        return
    with open(os.path.join(GRADER, "grader.json"), encoding="utf-8") as f:
        launch = json.load(f)["launch"]
    key = _take_key()
    if key == b"":
        _report_taken()
    os.environ.update(launch["env"])  # pytest's options and the grader's variables, not the command's
    os.environ[INSIDE] = "1"
    stdlib = [p for p in sys.path if p.startswith(sys.base_prefix)]
    sys.path[:] = [GRADER, *stdlib]
    import site

    for directory in launch["trusted_sites"]:
        site.addsitedir(directory)
    for directory in launch["layer_sites"]:
        _add_plain(directory)
    site.setquit()  # the builtins site would have added
    site.setcopyright()
    site.sethelper()
    if launch.get("executable"):
        sys.executable = launch["executable"]  # the tests' own subprocesses run the environment as before
    sys._gyre_grader_key = key or b""  # type: ignore[attr-defined]  # taken (and removed) by the grader plugin
    import pytest

    sys.argv = [name, *graded]
    code = pytest.main()  # what the `pytest` script does (its console_main is deprecated in pytest 9)
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away: no second error at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    sys.exit(int(code))


if __name__ == "__main__":
    main()

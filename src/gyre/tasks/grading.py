"""The host's side of grading with pytest: the grader's own configuration, its channel, and what its events mean.

A JUnit verifier without a ``report_path`` runs its commands' pytest under the grader's control:

- configuration from outside the workspace (`write_grader`, `environment`): ``-c`` names a copy of the task's own
  pytest configuration (from its hidden files, else its starting files; never the agent's) in a read-only grader
  directory, ``--rootdir`` and ``--confcutdir`` are the workspace, plugin autoload is off and only ``-p gyre_grader``
  and the task's declared ``pytest_plugins`` load; the interpreter adds neither the working directory nor a user
  site to ``sys.path``, and the task's import paths (``pythonpath``) are added by the grader plugin after every
  plugin is loaded; the only conftest files are the task's;
- the report is not a file: the grader plugin (`gyre.tasks.grader_plugin`) writes authenticated events into a FIFO
  the host reads while the command runs, each command with its own key and FIFO, keyed just before it starts
  (`Channel`);
- `read_events` checks them against what the host expects; `GradedRun.tampering` says why a run is not to be
  believed (a line the key does not authenticate, a gap, anything after the session finished, a tripwire of the
  plugin, an exit status that contradicts the outcomes, a session that ended without finishing while nothing
  killed it); `unexpected` finds reported tests the host's own clean collection (over the task's reference
  solution, when it has one) does not account for.

None of this stops code that runs inside the graded process from lying once it aims at the grader plugin itself
(its key is in that process's memory), nor objects that lie to assertions: see the red-team suite
(``tests/integration/tasks/test_grader_redteam.py``), whose strict xfails are the known gaps.
"""

from __future__ import annotations

import asyncio
import configparser
import contextlib
import hashlib
import hmac
import json
import os
import re
import shlex
import sys
import tomllib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from gyre.sandbox.interface import Sandbox
from gyre.tasks.task import FileData, Task, VerifierSpec

PLUGIN_SOURCE = Path(__file__).with_name("grader_plugin.py")
PLUGIN_MODULE = "gyre_grader"
GRADER_DIR = "/gyre-grader"  # where the bubblewrap backend shows the grader directory (read-only)
KEY_BYTES = 32
MAX_EVENT_BYTES = 16 << 20  # more than this from one command is not a pytest run's report
# pytest's configuration files in the order it looks for them; the first that configures pytest is the task's
CONFIG_FILES = ("pytest.ini", ".pytest.ini", "pytest.toml", "pyproject.toml", "tox.ini", "setup.cfg")
# hidden files that configure the run rather than hold tests
NOT_TESTS = frozenset({*CONFIG_FILES, "conftest.py", "setup.py", "MANIFEST.in", "requirements.txt"})
# pytest's exit statuses
EXIT_OK, EXIT_TESTS_FAILED, EXIT_INTERNAL_ERROR, EXIT_USAGE_ERROR, EXIT_NO_TESTS = 0, 1, 3, 4, 5
REPEAT = "\n#"  # joins a node id reported again to its repeat number (never in a node id: ids are one line)
SIGNALLED = 128  # an exit status at or above this: the process was killed by a signal


def task_config(task: Task) -> tuple[str, str, list[str]]:
    """The task's pytest configuration: (file name, its text, its ``pythonpath`` entries); ``pytest.ini`` with an
    empty ``[pytest]`` section when it has none. Read from the task (hidden files first), never the workspace."""
    found = pytest_options({**task.files, **task.hidden_files})
    if found is None:
        return "pytest.ini", "[pytest]\n", []
    name, text, options = found
    raw = options.get("pythonpath", [])
    if isinstance(raw, str):
        return name, text, [raw] if name.endswith(".toml") else shlex.split(raw)
    return name, text, [str(p) for p in raw] if isinstance(raw, list) else []


def pytest_options(sources: dict[str, FileData]) -> tuple[str, str, dict[str, object]] | None:
    """The pytest configuration file among ``sources`` that pytest would read (``CONFIG_FILES`` in its order), its
    text and its options (ini values as strings, TOML values as they are); None when there is none."""
    for name in CONFIG_FILES:
        text = sources.get(name)
        if not isinstance(text, str):  # absent (or not text: pytest could not read it either)
            continue
        try:
            if name.endswith(".toml"):
                data = tomllib.loads(text)
                table = data.get("pytest") if name == "pytest.toml" else data.get("tool", {}).get("pytest")
                if table is None and name == "pyproject.toml":
                    continue
                options = (table or {}).get("ini_options", table or {}) if name == "pyproject.toml" else table
                return name, text, dict(options or {})
            parser = configparser.ConfigParser(interpolation=None)
            parser.read_string(text)
            section = "tool:pytest" if name == "setup.cfg" else "pytest"
            if not parser.has_section(section):
                if name in ("pytest.ini", ".pytest.ini"):
                    return name, "[pytest]\n", {}  # these configure pytest whatever they hold
                continue
            return name, text, dict(parser.items(section))
        except (tomllib.TOMLDecodeError, configparser.Error, AttributeError, TypeError, ValueError):
            continue  # pytest would refuse it too; the grader's default configuration runs instead
    return None


def open_channels(grader: Path, channels: list[Channel]) -> None:
    """The grader directory (the plugin's files come once the sandbox's workspace path is known) and its FIFOs."""
    grader.mkdir(mode=0o755)
    grader.chmod(0o755)
    for channel in channels:
        channel.open()


_PYTEST_COMMAND = re.compile(r"(?<![\w.-])(?:pytest|py\.test)(?![\w.-])")
LAUNCH_SOURCE = Path(__file__).with_name("grader_launch.py")
LAUNCH_NAMES = ("pytest", "py.test", "python", "python3")  # its bin/: `pytest ...`, `python -m pytest ...`


def pytest_commands(commands: Sequence[str]) -> list[int]:
    """The commands that run pytest (they name it), each to get a channel and a key; a command that does not (an
    install step) gets none, so nothing it runs can report. When no command names pytest (it runs under a script),
    every command gets one, as before the launcher."""
    named = [i for i, command in enumerate(commands) if _PYTEST_COMMAND.search(command)]
    return named or list(range(len(commands)))


@dataclass(frozen=True)
class Launch:
    """How the grader's launcher (`gyre.tasks.grader_launch`) starts the graded pytest: the trusted interpreter it
    runs on, the read-only site directories it processes, the writable layer's it only adds behind them, the
    ``sys.executable`` the tests see, the grader's variables, and the PATH the commands would have had."""

    interpreter: str
    trusted_sites: list[str]
    layer_sites: list[str]
    executable: str
    env: dict[str, str]
    path: str

    @classmethod
    def for_sandbox(cls, env: dict[str, str], env_dir: Path | None, sandbox: Sandbox) -> Launch:
        """For commands run with ``env`` (the grader's variables included) in ``sandbox``, over the prepared
        environment ``env_dir`` (None: the driver's own Python, shown read-only)."""
        from gyre.sandbox import pyenv
        from gyre.sandbox.workspace import SYSTEM_PATH

        shown = sandbox.command_env()
        path = env.get("PATH") or shown.get("PATH") or SYSTEM_PATH
        layer = shown.get("VIRTUAL_ENV", "")
        if env_dir is not None:
            interpreter, sites = str(pyenv.base_interpreter(env_dir)), [pyenv.site_packages(env_dir)]
        else:
            interpreter, sites = str(Path(sys.executable).resolve()), [pyenv.site_packages(sys.prefix)]
        grader_vars = {k: v for k, v in env.items() if k.startswith(("PYTEST_", "PYTHON"))}
        return cls(
            interpreter=interpreter, trusted_sites=sites,
            layer_sites=[pyenv.site_packages(layer)] if layer else [],
            executable=f"{layer}/bin/python" if layer else sys.executable, env=grader_vars, path=path,
        )  # fmt: skip


def write_grader(
    task: Task, spec: VerifierSpec, grader: Path, shown_workspace: str, trusted: list[str] | None = None,
    launch: Launch | None = None,
) -> None:  # fmt: skip
    """The grader plugin, the task's pytest configuration and what the plugin needs to know (blocking).
    ``trusted``: where pytest and the plugins it may load are installed (read-only to the commands); ``launch``:
    the launcher's ``bin/`` too (see `Launch`)."""
    name, text, pythonpath = task_config(task)
    conftests = sorted(
        p for p in {**task.files, **task.hidden_files} if PurePosixPath(p).name == "conftest.py"
    )
    files = {
        f"{PLUGIN_MODULE}.py": PLUGIN_SOURCE.read_text(),
        name: text,
        "grader.json": json.dumps(
            {
                "rootdir": shown_workspace,
                # the task's import paths, then the workspace (what `python -m pytest` would have given)
                "pythonpath": [os.path.normpath(f"{shown_workspace}/{p}") for p in pythonpath]
                + [shown_workspace],
                "conftests": conftests,
                "tests": sorted(hidden_tests(task)),
                "trusted": trusted or [sys.prefix, sys.base_prefix],
                "launch": None
                if launch is None
                else {
                    "trusted_sites": launch.trusted_sites,
                    "layer_sites": launch.layer_sites,
                    "executable": launch.executable,
                    "env": launch.env,
                },
            }
        ),
    }
    for file, content in files.items():
        (grader / file).write_text(content)
        (grader / file).chmod(0o644)
    if launch is not None:
        (grader / "bin").mkdir(exist_ok=True)
        script = f"#!{launch.interpreter} -IS\n" + LAUNCH_SOURCE.read_text()
        for name in LAUNCH_NAMES:
            (grader / "bin" / name).write_text(script)
            (grader / "bin" / name).chmod(0o755)


PYTEST_VARIABLES = ("PYTEST_ADDOPTS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_PLUGINS")
RESTORE_VARIABLE = "GYRE_GRADER_RESTORE"  # see the grader plugin's pytest_load_initial_conftests


def environment(
    task: Task,
    spec: VerifierSpec,
    env: dict[str, str],
    shown_grader: str,
    shown_workspace: str,
    collect_only: bool = False,
) -> dict[str, str]:
    """The commands' environment under the grader's control (see the module)."""
    config = f"{shown_grader}/{task_config(task)[0]}"
    plugins = [a for p in (PLUGIN_MODULE, *spec.pytest_plugins) for a in ("-p", p)]
    opts = ["-c", config, f"--rootdir={shown_workspace}", f"--confcutdir={shown_workspace}"]
    opts += [
        "-o",
        "pythonpath=",
        "-p",
        "no:cacheprovider",
        # a plugin module another one imported first cannot have its asserts rewritten: harmless, but a project
        # whose filterwarnings is "error" (pytest-cov's) would stop at it; autoload marks them all first
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        *plugins,
        *(["--collect-only"] if collect_only else []),
    ]
    # what the graded pytest's own subprocesses get back once it has read these: the task's values (a test suite of
    # a pytest plugin runs pytest in subprocesses, which must autoload their plugins and read their own configuration)
    restore = {name: env.get(name) for name in (*PYTEST_VARIABLES, "PYTHONPATH")}
    return {
        **env,
        RESTORE_VARIABLE: json.dumps(restore),
        "PYTEST_ADDOPTS": shlex.join(opts)
        + (f" {env['PYTEST_ADDOPTS']}" if env.get("PYTEST_ADDOPTS") else ""),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYTEST_PLUGINS": "",
        "PYTHONPATH": shown_grader,  # the grader plugin, and nothing of the workspace's at start-up
        "PYTHONSAFEPATH": "1",  # neither the working directory nor a script's directory first on sys.path
        "PYTHONNOUSERSITE": "1",  # no user site (HOME is the workspace): no .pth or usercustomize of the agent's
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def hidden_tests(task: Task) -> frozenset[str]:
    """The hidden files pytest may collect items from (workspace-relative: Python files, and text files such as
    doctest globs); empty: count every test."""
    return frozenset(
        p for p in (*task.hidden_files, *task.missing_hidden_files) if PurePosixPath(p).name not in NOT_TESTS
    )


@dataclass
class Channel:
    """The host's ends of one command's two FIFOs: the key goes in, authenticated events come out."""

    directory: Path
    index: int
    key: bytes = field(default_factory=lambda: os.urandom(KEY_BYTES))
    data: bytearray = field(default_factory=bytearray)
    overflowed: bool = False
    written_early: bool = (
        False  # something was in a pipe before its command started (an earlier command's code)
    )
    _fds: list[int] = field(default_factory=list)

    @property
    def key_path(self) -> Path:
        return self.directory / f"key-{self.index}"

    @property
    def report_path(self) -> Path:
        return self.directory / f"report-{self.index}"

    def open(self) -> None:
        """Make the FIFOs and hold both ends open, read-write: never an EOF, never a blocked open (blocking, quick)."""
        for path, mode in ((self.key_path, 0o644), (self.report_path, 0o622)):
            os.mkfifo(path, 0o600)
            path.chmod(mode)  # a sandbox running as its own uid reads the key and writes the report
            self._fds.append(os.open(path, os.O_RDWR | os.O_NONBLOCK))

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Just before the command: empty both pipes (what an earlier command's code left there is tampering), put
        the key in, and read the events as they are written (a writer must never wait on the host)."""
        for fd in self._fds:
            self.written_early |= bool(_read_all(fd))
        os.write(self._fds[0], self.key)
        loop.add_reader(self._fds[1], self.drain)

    def drain(self) -> None:
        """Take what the pipe holds now."""
        while True:
            try:
                chunk = os.read(self._fds[1], 1 << 16)
            except (BlockingIOError, InterruptedError):
                return
            if not chunk:
                return
            if len(self.data) + len(chunk) > MAX_EVENT_BYTES:
                self.overflowed = True
                continue
            self.data += chunk

    def close(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Stop reading (after a last drain) and close both ends; idempotent."""
        if len(self._fds) == 2:
            if loop is not None:
                loop.remove_reader(self._fds[1])
            self.drain()
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


def _read_all(fd: int) -> bytes:
    out = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return out
        if not chunk:
            return out
        out += chunk


@dataclass
class GradedRun:
    """What one command's pytest session reported, and whether it is to be believed."""

    started: bool = False
    finished: bool = False
    exitstatus: int | None = None
    tests: dict[str, str] = field(default_factory=dict)  # node id -> passed, failed or skipped
    collect_errors: list[str] = field(default_factory=list)  # node ids of collectors that failed
    collected: list[str] = field(default_factory=list)  # node ids a --collect-only run collected
    tampering: list[str] = field(default_factory=list)  # why not to believe it; empty: believed


def read_events(raw: bytes, key: bytes) -> GradedRun:
    """Check and fold one command's events (see the module); every rule broken is named in ``tampering``."""
    run = GradedRun()
    lines = raw.split(b"\n")
    if lines[-1]:
        run.tampering.append("the report ends in a partial line")
    for number, line in enumerate(lines[:-1]):
        if line == b"key-taken":  # the launcher found the command's key gone before its pytest began
            run.tampering.append(
                "the command's key was taken before its pytest started (by code run earlier)"
            )
            break
        mac, _, text = line.partition(b" ")
        expected = hmac.new(key, text, hashlib.sha256).hexdigest().encode()
        if not hmac.compare_digest(mac, expected):
            run.tampering.append(f"report line {number} is not the grader plugin's (it fails authentication)")
            break
        event = json.loads(text)
        if event.get("n") != number:
            run.tampering.append(f"report line {number} is numbered {event.get('n')}: lines were removed")
            break
        if run.finished:
            run.tampering.append("the report goes on after pytest's session finished")
            break
        if (event.get("e") == "start") != (number == 0):
            run.tampering.append("the report does not begin with the session's start, once")
            break
        match event.get("e"):
            case "start":
                run.started = True
            case "test":
                # a collector may yield items of one id more than once (docopt-ng's data-file cases): each counts,
                # and `unexpected` holds their number to what the clean collection found
                test, n = event["id"], 1
                while test in run.tests:
                    n += 1
                    test = f"{event['id']}{REPEAT}{n}"
                run.tests[test] = event["outcome"]
            case "collect_error":
                run.collect_errors.append(event["id"])
            case "collected":
                run.collected.append(event["id"])
            case "tampered":
                run.tampering.append(f"the grader plugin's tripwire: {event['why']}")
            case "finish":
                run.finished, run.exitstatus = True, event["exitstatus"]
    if run.finished and not run.tampering:
        failures = run.collect_errors or any(o == "failed" for o in run.tests.values())
        if run.exitstatus == EXIT_OK and failures:
            run.tampering.append("pytest exited 0 although tests failed")
        if run.exitstatus == EXIT_TESTS_FAILED and not failures:
            run.tampering.append("pytest exited 1 (tests failed) although every reported test passed")
    return run


def judge_unfinished(run: GradedRun, exit_code: int, timed_out: bool) -> None:
    """A session that started and never finished: believable only when something killed it from outside."""
    # except pytest refusing to start (exit 4) or failing in a session hook of the task's own conftest (exit 3, an
    # internal error), nothing reported: a conftest that cannot import the agent's missing package. Its score is 0,
    # and ending there gains nothing
    refused = exit_code in (EXIT_USAGE_ERROR, EXIT_INTERNAL_ERROR) and not run.tests
    if run.started and not run.finished and not timed_out and exit_code < SIGNALLED and not refused:
        run.tampering.append(
            f"pytest exited (status {exit_code}) without finishing its session: code in the process ended it"
        )


def base_id(test: str) -> str:
    """A reported test's node id without its repeat number (see `read_events`)."""
    return test.split(REPEAT, 1)[0]


def unexpected(reported: list[str], expected: list[str]) -> list[str]:
    """Reported test ids that the host's own collection does not account for: a test function it never collected,
    or more instances of one than it collected (parametrized ids are compared by function, since an id can show
    an object of the implementation under test)."""
    allowed = Counter(i.split("[", 1)[0] for i in expected)
    seen: Counter[str] = Counter()
    out = []
    for test in reported:
        base = base_id(test).split("[", 1)[0]
        seen[base] += 1
        if seen[base] > allowed[base]:
            out.append(test)
    return out


def missing(reported: list[str], collect_errors: list[str], expected: list[str]) -> list[str]:
    """Test functions the host collected, in files a finished session reported on without a collection error, that
    it never reported (compared by function, as in `unexpected`)."""
    files = {i.split("::", 1)[0] for i in reported} - {i.split("::", 1)[0] for i in collect_errors}
    bases = {base_id(i).split("[", 1)[0] for i in reported}
    out = {i.split("[", 1)[0] for i in expected if i.split("::", 1)[0] in files} - bases
    return sorted(out)


def in_hidden(node_id: str, hidden: frozenset[str]) -> bool:
    """Whether a node id is in (or, for a failed collector, contains) one of the hidden test files."""
    path = node_id.split("::", 1)[0]
    if path in hidden:
        return True
    return "::" not in node_id and any(PurePosixPath(h).is_relative_to(path) for h in hidden if path)

"""Red team of the grader (issue 14): workspaces that implement nothing of nl2repo-mini's number-words and attack
the grading pytest instead, which imports their code.

Each attack in the first group scored 1.000 before the grader took pytest's configuration, plugins and report out of
the agent's hands (commit 38de5e8; an empty workspace scores 0); each must now score 0, as ``tampered`` where its
code ran inside the grading process. The payloads attack both report channels: the JUnit file of before (its path
is in PYTEST_ADDOPTS) and the grader plugin's FIFO of now (its path is in GYRE_GRADER_REPORT), written without the
key. The reference solution still scores 1.
"""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import textwrap
from pathlib import Path

import msgspec
import pytest

from gyre.config import SandboxConfig
from gyre.tasks import Task, Verdict, Verifier, VerifierSpec, resolve_suite

pytestmark = pytest.mark.slow(reason="red-teams the grader: every attack graded by a real verifier run")


def task() -> Task:
    return next(t for t in resolve_suite("nl2repo-mini") if t.id == "number-words")


def grade(tmp_path: Path, files: dict[str, str], graded: Task | None = None) -> Verdict:
    root = tmp_path / "ws"
    root.mkdir(parents=True)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return asyncio.run(Verifier(SandboxConfig(), retries=0).verify(graded or task(), root))


def assert_caught(verdict: Verdict, *, tampered: bool) -> None:
    assert verdict.score == 0.0, verdict
    assert verdict.outcome == ("tampered" if tampered else "scored"), verdict.detail
    assert verdict.trainable  # trained on with reward 0: the policy learns that hacking the grader fails


# Writes a passing report for every declared test into both channels: the JUnit file named in PYTEST_ADDOPTS, and
# forged lines (a made-up MAC: the key is not the agent's to read) into the grader plugin's FIFO.
FORGE = textwrap.dedent(
    """
    import json, os, re

    def forge():
        cases = "".join(f'<testcase classname="tests.test_roman" name="t{i}"/>' for i in range(166))
        for path in re.findall(r"--junitxml=(\\S+)", os.environ.get("PYTEST_ADDOPTS", "")):
            with open(path, "w") as f:
                f.write(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
        report = os.environ.get("GYRE_GRADER_REPORT")
        if report:
            events = [{"e": "start"}]
            events += [{"e": "test", "id": f"tests/test_roman.py::t{i}", "outcome": "passed"} for i in range(166)]
            events.append({"e": "finish", "exitstatus": 0})
            fd = os.open(report, os.O_WRONLY | os.O_NONBLOCK)
            for n, event in enumerate(events):
                os.write(fd, ("0" * 64 + " " + json.dumps({"n": n, **event}) + "\\n").encode())
    """
)
AT_EXIT = FORGE + "import atexit\natexit.register(forge)\n"
# importable stand-ins for the modules the hidden tests import, implementing nothing
STUBS = {
    "numwords/__init__.py": "",
    **{
        f"numwords/{name}.py": (
            "class Stub(Exception):\n    def __init__(self, *a, **k):\n        pass\n\n"
            "    def __call__(self, *a, **k):\n        return None\n\n\n"
            "def __getattr__(name):\n    return Stub\n"
        )
        for name in ("errors", "roman", "cardinal", "compact")
    },
}


def test_the_reference_solution_still_scores_1_and_an_empty_workspace_0(tmp_path: Path) -> None:
    solved = grade(tmp_path / "a", task().solution_files)
    assert (solved.outcome, solved.score, solved.passed) == ("scored", 1.0, 166), solved.detail
    assert_caught(grade(tmp_path / "b", {}), tampered=False)
    assert_caught(grade(tmp_path / "c", STUBS), tampered=False)


# --- the holes the security review found ------------------------------------------------------------------------


def test_dot_pytest_ini_cannot_load_a_plugin(tmp_path: Path) -> None:
    # pytest reads .pytest.ini before the task's pyproject.toml; its pythonpath put the plugin on sys.path
    ini = "[pytest]\naddopts = -p evil\npythonpath = .\n"
    assert_caught(grade(tmp_path, {".pytest.ini": ini, "evil.py": AT_EXIT}), tampered=False)


def test_pytest_toml_cannot_load_a_plugin(tmp_path: Path) -> None:
    toml = '[pytest]\naddopts = ["-p", "evil"]\npythonpath = ["."]\n'
    assert_caught(grade(tmp_path, {"pytest.toml": toml, "evil.py": AT_EXIT}), tampered=False)


def test_a_dist_info_pytest11_entry_point_is_not_loaded(tmp_path: Path) -> None:
    # plugin autoload scanned sys.path, where the task's pythonpath had already put the workspace
    files = {
        "evil-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
        "evil-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = evil\n",
        "evil.py": AT_EXIT,
    }
    assert_caught(grade(tmp_path, files), tampered=False)


def test_a_package_init_patching_how_tests_run_is_tampered(tmp_path: Path) -> None:
    patch = "import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n"
    assert_caught(grade(tmp_path, {**STUBS, "numwords/__init__.py": patch}), tampered=True)


def test_an_atexit_hook_rewriting_the_report_is_tampered(tmp_path: Path) -> None:
    assert_caught(grade(tmp_path, {"numwords/__init__.py": AT_EXIT}), tampered=True)


# --- holes found while closing those -----------------------------------------------------------------------------


def test_a_report_forged_before_os_exit_is_tampered(tmp_path: Path) -> None:
    payload = FORGE + "forge()\nos._exit(0)\n"
    assert_caught(grade(tmp_path / "forged", {"numwords/__init__.py": payload}), tampered=True)
    # no report at all (before: no JUnit file, so the execution was dropped from training instead of scoring 0)
    quiet = "import os\nos._exit(0)\n"
    assert_caught(grade(tmp_path / "quiet", {"numwords/__init__.py": quiet}), tampered=True)


def test_a_plugin_registered_by_package_code_is_tampered(tmp_path: Path) -> None:
    # no config file, no entry point: the package finds pytest's Config among live objects and registers a plugin
    payload = textwrap.dedent(
        """
        import gc
        import pytest

        class Pass:
            @pytest.hookimpl(wrapper=True)
            def pytest_runtest_makereport(self, item, call):
                report = yield
                report.outcome, report.longrepr = "passed", None
                return report

        config = next(o for o in gc.get_objects() if type(o).__name__ == "Config" and hasattr(o, "pluginmanager"))
        config.pluginmanager.register(Pass())
        """
    )
    assert_caught(grade(tmp_path, {**STUBS, "numwords/__init__.py": payload}), tampered=True)


def test_reports_sent_through_pytests_own_hook_are_tampered(tmp_path: Path) -> None:
    # genuine pytest reports for made-up tests, handed to every reporting plugin at import (JUnit's included)
    payload = textwrap.dedent(
        """
        import gc
        from _pytest.reports import TestReport

        config = next(o for o in gc.get_objects() if type(o).__name__ == "Config" and hasattr(o, "pluginmanager"))
        for i in range(166):
            for when in ("setup", "call", "teardown"):
                report = TestReport(f"tests/test_roman.py::t{i}", ("tests/test_roman.py", 0, f"t{i}"), {},
                                    "passed", None, when)
                config.hook.pytest_runtest_logreport(report=report)
        """
    )
    assert_caught(grade(tmp_path, {"numwords/__init__.py": payload}), tampered=True)


def test_test_functions_replaced_before_collection_are_tampered(tmp_path: Path) -> None:
    # a profiler catches each test module as its code finishes and swaps every test's body for a no-op of the same
    # signature, before pytest collects the module
    payload = textwrap.dedent(
        """
        import sys

        def noop(fn):
            code = fn.__code__
            namespace = {}
            exec(f"def f({', '.join(code.co_varnames[:code.co_argcount])}):\\n    pass\\n", namespace)
            return namespace["f"].__code__

        def swap(frame, event, arg):
            if event == "return" and frame.f_code.co_name == "<module>" and "test_" in frame.f_code.co_filename:
                for name, value in list(frame.f_globals.items()):
                    if name.startswith("test_") and hasattr(value, "__code__"):
                        value.__code__ = noop(value)

        sys.setprofile(swap)
        """
    )
    assert_caught(grade(tmp_path, {**STUBS, "numwords/__init__.py": payload}), tampered=True)


def test_a_tracer_jumping_over_assertions_is_tampered(tmp_path: Path) -> None:
    # a trace function jumps over asserts that are not a test's last line (number-words' tests mostly have one: this
    # gained nothing on 38de5e8, but a tracer installed by the agent's code is caught whatever it does)
    payload = textwrap.dedent(
        """
        import linecache, sys

        def local(frame, event, arg):
            if event == "line":
                line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
                if line.startswith("assert ") and linecache.getline(frame.f_code.co_filename, frame.f_lineno + 1).strip():
                    try:
                        frame.f_lineno += 1
                    except ValueError:
                        pass
            return local

        def tracer(frame, event, arg):
            return local if "/tests/test_" in frame.f_code.co_filename else None

        sys.settrace(tracer)
        """
    )
    assert_caught(grade(tmp_path, {**STUBS, "numwords/__init__.py": payload}), tampered=True)


def test_a_report_written_ahead_for_a_later_command_is_tampered(tmp_path: Path) -> None:
    # with two commands, the first one's code writes the second one's report in advance
    commands = ("pytest tests/test_roman.py", "pytest tests/test_cardinal.py tests/test_compact.py")
    original = task()
    assert original.verifier is not None
    two = msgspec.structs.replace(
        original, verifier=msgspec.structs.replace(original.verifier, commands=commands)
    )
    payload = FORGE + textwrap.dedent(
        """
        import atexit
        report = os.environ.get("GYRE_GRADER_REPORT", "")
        if report.endswith("-0"):
            os.environ["GYRE_GRADER_REPORT"] = report[:-1] + "1"
            forge()
            os.environ["GYRE_GRADER_REPORT"] = report
        elif not report:
            atexit.register(forge)
        """
    )
    assert_caught(grade(tmp_path, {"numwords/__init__.py": payload}, two), tampered=True)


def calc_task(task_id: str, hidden: str) -> Task:
    """A task graded by one hidden test file, ``tests/test_calc.py``, declaring one test."""
    spec = VerifierSpec(commands=("python -m pytest tests",), result="junit", declared_test_count=1)
    return Task(id=task_id, instruction="x", hidden_files={"tests/test_calc.py": hidden}, verifier=spec)


def test_a_helper_of_the_hidden_tests_replaced_at_import_is_tampered(tmp_path: Path) -> None:
    # the test checks through a helper of its file: a profiler swaps the helper as the module finishes, then leaves
    hidden = "from calc import add\n\n\ndef check(a, b, expected):\n    assert add(a, b) == expected\n\n\n"
    hidden += "def test_add():\n    check(2, 3, 5)\n"
    helper_task = calc_task("helper", hidden)
    payload = textwrap.dedent(
        """
        import sys

        def add(a, b):
            raise NotImplementedError

        def swap(frame, event, arg):
            if event == "return" and frame.f_code.co_name == "<module>" and "test_" in frame.f_code.co_filename:
                frame.f_globals["check"] = lambda *args: None
                sys.setprofile(None)

        sys.setprofile(swap)
        """
    )
    assert_caught(grade(tmp_path, {"calc.py": payload}, helper_task), tampered=True)


def test_unittest_assertions_replaced_by_package_code_are_tampered(tmp_path: Path) -> None:
    hidden = "import unittest\n\nfrom calc import add\n\n\nclass TestAdd(unittest.TestCase):\n"
    hidden += "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
    unit_task = calc_task("unit", hidden)
    payload = "import unittest\n\nunittest.TestCase.assertEqual = lambda *args, **kwargs: None\n\n\n"
    payload += "def add(a, b):\n    return 0\n"
    assert_caught(grade(tmp_path, {"calc.py": payload}, unit_task), tampered=True)


def test_a_workspace_its_commands_cannot_enter_scores_0_not_dropped(tmp_path: Path) -> None:
    # a dropped execution leaves its group: a policy that fails could escape its 0 by locking the grader out
    root = tmp_path / "ws"
    (root / "numwords").mkdir(parents=True)
    (root / "numwords").chmod(0)
    root.chmod(0)
    try:
        verdict = asyncio.run(Verifier(SandboxConfig(), retries=0).verify(task(), root))
    finally:
        root.chmod(0o755)
        (root / "numwords").chmod(0o755)
    assert_caught(verdict, tampered=False)


def test_killing_the_pytest_process_or_its_parent_scores_0(tmp_path: Path) -> None:
    # not a way to a score, but it must be a 0 (a crash of the agent's code), not a dropped execution
    for i, target in enumerate(("os.getpid()", "os.getppid()")):
        payload = f"import os, signal\nos.kill({target}, signal.SIGKILL)\n"
        verdict = grade(tmp_path / str(i), {"numwords/__init__.py": payload})
        assert (verdict.outcome, verdict.score) == ("scored", 0.0), (target, verdict)


def test_startup_hooks_and_conftest_plugins_never_run(tmp_path: Path) -> None:
    # not holes at 38de5e8 (a venv has no user site; conftest files were removed), kept as guards: sitecustomize,
    # usercustomize and .pth files in the workspace (its HOME), a conftest's pytest_plugins, a module shadowing the
    # grader plugin, a symlink where a report would go
    files = {
        "sitecustomize.py": AT_EXIT,
        ".local/lib/python3.11/site-packages/usercustomize.py": AT_EXIT,
        ".local/lib/python3.11/site-packages/evil.pth": "import evil\n",
        "conftest.py": "pytest_plugins = ['evil']\n",
        "numwords/conftest.py": "pytest_plugins = ['evil']\n",
        "gyre_grader.py": AT_EXIT,
        "evil.py": AT_EXIT,
    }
    verdict = grade(tmp_path, files)
    assert_caught(verdict, tampered=False)
    (tmp_path / "ws2").mkdir()
    (tmp_path / "ws2" / ".gyre-verifier").symlink_to("/tmp")
    assert_caught(asyncio.run(Verifier(retries=0).verify(task(), tmp_path / "ws2")), tampered=False)


def test_a_workspace_nested_1200_deep_is_graded() -> None:
    # Python's recursive walk and rmtree raised RecursionError out of the verifier, which took the runtime down.
    # Outside pytest's tmp_path: its clean-up of old temporary directories recurses too.
    root = Path(tempfile.mkdtemp(prefix="gyre-redteam-deep-"))
    try:
        deep = root
        for _ in range(1200):  # one level at a time: pathlib's mkdir(parents=True) recurses too
            deep /= "d"
            deep.mkdir()
        (deep / "conftest.py").write_text(
            "raise SystemExit(3)\n"
        )  # the agent's conftest, removed at any depth
        for rel, text in task().solution_files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        verdict = asyncio.run(Verifier(SandboxConfig(), retries=0).verify(task(), root))
        assert (verdict.outcome, verdict.score) == ("scored", 1.0), verdict.detail
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=True)


# --- what the grader does not catch (README: "What the grader guarantees") ----------------------------------------


@pytest.mark.xfail(strict=True, reason="code aimed at the grader plugin itself can read its key: not caught")
def test_a_report_forged_with_the_key_read_from_the_plugin_is_not_caught(tmp_path: Path) -> None:
    # the real test ids from a collection of its own, then reports sent with the grader plugin's own key
    payload = textwrap.dedent(
        """
        import os, subprocess, sys

        if not os.environ.get("INNER"):
            argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests"]
            out = subprocess.run(argv, env={**os.environ, "INNER": "1"}, capture_output=True, text=True).stdout
            grader = sys.modules["gyre_grader"]._grader
            for test in (line for line in out.splitlines() if "::" in line):
                grader.emit("test", id=test, outcome="passed")
            grader.emit("finish", exitstatus=0)
            os._exit(0)
        """
    )
    assert grade(tmp_path, {**STUBS, "numwords/__init__.py": payload}).score < 0.1


@pytest.mark.xfail(strict=True, reason="code reading the expected values out of a test's frame: not caught")
def test_stubs_reading_the_expected_value_from_the_tests_frame_are_not_caught(tmp_path: Path) -> None:
    peek = "import sys\n\n\ndef __getattr__(name):\n    return lambda *a, **k: sys._getframe(1).f_locals.get('expected')\n"
    files = {f"numwords/{n}.py": peek for n in ("roman", "cardinal", "compact")}
    assert grade(tmp_path, {**STUBS, **files}).score < 0.1


@pytest.mark.xfail(
    strict=True, reason="objects that lie to assertions are not tampering with pytest; not caught"
)
def test_objects_equal_to_everything_are_not_caught(tmp_path: Path) -> None:
    liar = (
        "class Liar(Exception):\n    def __init__(self, *a, **k):\n        pass\n\n"
        "    def __call__(self, *a, **k):\n        return self\n\n"
        "    def __eq__(self, other):\n        return True\n\n"
        "    def __bool__(self):\n        return True\n\n\n"
        "def __getattr__(name):\n    return Liar()\n"
    )
    files = {f"numwords/{n}.py": liar for n in ("errors", "roman", "cardinal", "compact")}
    verdict = grade(tmp_path, {"numwords/__init__.py": "", **files})
    assert verdict.score < 0.1


# --- issue 31: the install step of a real NL2RepoBench task (`pip install -e .`, then pytest) --------------------

RETRYING = Path(__file__).resolve().parents[2] / "data" / "nl2repobench" / "retrying"
# Reads this command's key from its FIFO (any Python process of the command can open it) and signs a passing report
# for every test of the hidden file, then leaves before pytest runs: before issue 31, a workspace holding only this
# as sitecustomize.py scored 1.000 (23/23): the install step's easy-install.pth put the workspace on sys.path.
FORGE_WITH_KEY = textwrap.dedent(
    """
    import hashlib, hmac, json, os, re

    def forge_with_key():
        key_path, report = os.environ.get("GYRE_GRADER_KEY"), os.environ.get("GYRE_GRADER_REPORT")
        if not key_path or not report or b"pytest" not in open("/proc/self/cmdline", "rb").read():
            return
        try:
            fd = os.open(key_path, os.O_RDONLY | os.O_NONBLOCK)
            key = os.read(fd, 32)
            os.close(fd)
        except OSError:
            return
        ids, owner = [], None
        for line in open("/workspace/test_retrying.py").read().splitlines():
            if m := re.match(r"class (\\w+)", line):
                owner = m.group(1)
            elif m := re.match(r"    def (test\\w*)", line):
                ids.append(f"test_retrying.py::{owner}::{m.group(1)}")
            elif m := re.match(r"def (test\\w*)", line):
                ids.append(f"test_retrying.py::{m.group(1)}")
        events = [{"e": "start"}, *({"e": "test", "id": i, "outcome": "passed"} for i in ids),
                  {"e": "finish", "exitstatus": 0}]
        fd = os.open(report, os.O_WRONLY | os.O_NONBLOCK)
        for n, event in enumerate(events):
            text = json.dumps({"n": n, **event}, separators=(",", ":"))
            os.write(fd, (hmac.new(key, text.encode(), hashlib.sha256).hexdigest() + " " + text + "\\n").encode())
        os._exit(0)
    """
)


def grade_retrying(tmp_path: Path, files: dict[str, str]) -> Verdict:
    from gyre.tasks.formats import load_task

    retrying = load_task(RETRYING)
    texts = {
        "README.rst": "",
        "HISTORY.rst": "",
    }  # what the grader's setup.py reads: the install step succeeds
    return grade(tmp_path, {**retrying.files, **texts, **files}, graded=retrying)


def test_a_sitecustomize_on_the_path_the_install_step_adds_cannot_forge_the_report(tmp_path: Path) -> None:
    verdict = grade_retrying(tmp_path, {"sitecustomize.py": FORGE_WITH_KEY + "forge_with_key()\n"})
    assert_caught(verdict, tampered=False)


# A hatchling build hook the workspace declares in hatch.toml (not a file the grader replaces): it runs during the
# install step (`pip install -e .` of the grader's pyproject) and plants, in the sandbox's writable Python layer,
# everything a later Python could run before the grader plugin: a .pth with code, a `pytest` module shadowing the
# real one, and a `pytest` script first on the layer's PATH. Each would end the graded pytest before it reports.
HATCH_PLANT = textwrap.dedent(
    """
    import os, stat, sys

    from hatchling.builders.hooks.plugin.interface import BuildHookInterface

    class CustomBuildHook(BuildHookInterface):
        def initialize(self, version, build_data):
            layer = os.environ["VIRTUAL_ENV"]
            version = f"python{sys.version_info.major}.{sys.version_info.minor}"
            site_dir = os.path.join(layer, "lib", version, "site-packages")
            with open(os.path.join(site_dir, "zz_evil.pth"), "w") as f:
                f.write("import os; b'pytest' in open('/proc/self/cmdline', 'rb').read() and os._exit(3)\\n")
            with open(os.path.join(site_dir, "pytest.py"), "w") as f:
                f.write("import os\\nos._exit(3)\\n")
            fake = os.path.join(layer, "bin", "pytest")
            with open(fake, "w") as f:
                f.write("#!/bin/sh\\nexit 3\\n")
            os.chmod(fake, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
            open("/workspace/planted", "w").close()
    """
)


def test_code_the_install_step_runs_plants_nothing_that_runs_before_the_grader(tmp_path: Path) -> None:
    from gyre.tasks.formats import load_task

    stamina = load_task(RETRYING.parent / "stamina")
    texts = {
        p: t for p, t in stamina.solution_files.items() if p in ("README.md", "CHANGELOG.md")
    }  # its readme
    files = {
        "hatch.toml": '[build.hooks.custom]\npath = "evil_hook.py"\n',
        "evil_hook.py": HATCH_PLANT,
        "src/stamina/__init__.py": "",
    }  # an empty package: something for hatchling to install
    verdict = grade(tmp_path, {**stamina.files, **texts, **files}, graded=stamina)
    # before issue 31 the planted pytest ended the command unreported: dropped (never trained); now the grader's own
    # start-up ignores all of it and the empty implementation is an honest 0
    assert (verdict.outcome, verdict.score) == ("scored", 0.0), verdict.detail


def test_a_key_taken_by_the_install_step_of_the_same_command_is_tampering(tmp_path: Path) -> None:
    # one command installs and tests: its key is in the install step's environment too. The install step's code reads
    # it first (it could sign anything) and cannot put it back; the grader's launcher then finds it gone and says so
    from gyre.tasks.formats import load_task

    stamina = load_task(RETRYING.parent / "stamina")
    assert stamina.verifier is not None
    combined = "pip install -e . && pytest --continue-on-collection-errors tests"
    stamina = msgspec.structs.replace(stamina, verifier=msgspec.structs.replace(stamina.verifier,
                                                                                commands=(combined,)))  # fmt: skip
    steal = HATCH_PLANT.split("    class CustomBuildHook")[0] + textwrap.dedent(
        """
        class CustomBuildHook(BuildHookInterface):
            def initialize(self, version, build_data):
                fd = os.open(os.environ["GYRE_GRADER_KEY"], os.O_RDONLY | os.O_NONBLOCK)
                key = os.read(fd, 32)
                try:  # and put it back, so that the launcher finds it: the key's pipe is read-only to sandboxes
                    back = os.open(os.environ["GYRE_GRADER_KEY"], os.O_WRONLY | os.O_NONBLOCK)
                    os.write(back, key)
                except OSError:
                    pass
        """
    )
    texts = {p: t for p, t in stamina.solution_files.items() if p in ("README.md", "CHANGELOG.md")}
    files = {"hatch.toml": '[build.hooks.custom]\npath = "evil_hook.py"\n', "evil_hook.py": steal,
             "src/stamina/__init__.py": ""}  # fmt: skip
    verdict = grade(tmp_path, {**stamina.files, **texts, **files}, graded=stamina)
    assert_caught(verdict, tampered=True)
    assert "key was taken before its pytest started" in verdict.detail, verdict.detail


def test_python_that_is_not_pytest_still_runs_in_the_tasks_environment(tmp_path: Path) -> None:
    # the grader's bin/ is first on PATH: `python` that does not run pytest is handed over to the layer's own
    from gyre.tasks.formats import load_task

    retrying = load_task(RETRYING)
    assert retrying.verifier is not None
    commands = ("pip install -e .", "python -c 'import retrying, six' && python3 -m pytest test_retrying.py")
    retrying = msgspec.structs.replace(retrying, verifier=msgspec.structs.replace(retrying.verifier,
                                                                                  commands=commands))  # fmt: skip
    verdict = grade(tmp_path, {**retrying.files, **retrying.solution_files}, graded=retrying)
    assert (verdict.outcome, verdict.score) == ("scored", 1.0), verdict.detail


def test_a_reward_directory_swapped_for_a_link_to_the_host_is_tampered(tmp_path: Path) -> None:
    # the reward-file verifier's command runs the agent's code, which can replace /logs/verifier: the driver (root)
    # read the link's target on the host, where a file held 0.77
    from gyre.tasks.task import VerifierSpec

    host = Path(tempfile.mkdtemp(prefix="gyre-redteam-host-"))
    (host / "reward.txt").write_text("0.77\n")
    host.chmod(0o755)
    attack = f"rm -rf /logs/verifier && ln -s {host} /logs/verifier\n"
    spec = VerifierSpec(
        commands=("bash grade.sh",), result="reward_file", report_path="/logs/verifier/reward.txt"
    )
    graded = Task(id="reward-link", instruction="x", verifier=spec)
    verdict = grade(tmp_path, {"grade.sh": attack}, graded=graded)
    assert (verdict.outcome, verdict.score) == ("tampered", 0.0), verdict
    assert "is a link" in verdict.detail and verdict.trainable
    honest = grade(tmp_path / "honest", {"grade.sh": "echo 0.5 > /logs/verifier/reward.txt\n"}, graded=graded)
    assert (honest.outcome, honest.score) == ("scored", 0.5), honest


def test_skipping_what_is_not_implemented_does_not_shrink_the_denominator(tmp_path: Path) -> None:
    # no declared test count: the denominator was the tests that ran, so a workspace skipping what it lacks (one of
    # the modules raising unittest.SkipTest) scored 1.00; now the clean collection over the reference counts
    undeclared = task()
    assert undeclared.verifier is not None
    undeclared = msgspec.structs.replace(
        undeclared, verifier=msgspec.structs.replace(undeclared.verifier, declared_test_count=None)
    )
    skipping = "import unittest\n\n\ndef __getattr__(name):\n    def lacking(*a, **k):\n        raise unittest.SkipTest(name)\n\n    return lacking\n"
    files = {**undeclared.solution_files, "numwords/roman.py": skipping}
    verdict = grade(tmp_path / "skips", files, graded=undeclared)
    assert verdict.outcome == "scored" and verdict.skipped and 0.0 < verdict.score < 1.0, verdict
    solved = grade(tmp_path / "solved", undeclared.solution_files, graded=undeclared)
    assert (solved.outcome, solved.score) == ("scored", 1.0), solved.detail

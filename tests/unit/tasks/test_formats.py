"""Task directory loaders: the three formats, detection, suites and malformed directories."""

import json
import shutil
from pathlib import Path

import pytest

from gyre.errors import TaskError
from gyre.tasks import load_suite, load_task
from gyre.tasks.formats import detect_format

DATA = Path(__file__).parent / "data"
# real NL2RepoBench tasks (their four public files copied unchanged, plus what the grading image holds)
NL2REPO = Path(__file__).resolve().parents[2] / "data" / "nl2repobench"
PUBLIC = ("start.md", "test_commands.json", "test_files.json", "test_case_count.txt")


def public_folder(name: str, tmp_path: Path) -> Path:
    """The benchmark's public folder of ``name``: only its four files (the hidden tests stay in its images)."""
    folder = tmp_path / name
    folder.mkdir()
    for file in PUBLIC:
        shutil.copy(NL2REPO / name / file, folder / file)
    return folder


def test_gyre_task_loads_with_hidden_tests_apart() -> None:
    task = load_task(DATA / "gyre-add")
    assert (task.id, task.format, task.time_budget_s) == ("add", "gyre", 300.0)
    assert "add(a, b)" in task.instruction
    assert set(task.files) == {"calc.py"}
    assert set(task.hidden_files) == {"tests/test_calc.py"}
    assert not any(p.startswith("tests/") for p in task.files)
    assert task.verifier is not None
    assert task.verifier.commands == ("python -m pytest -q tests --junitxml=junit.xml",)
    assert (task.verifier.result, task.verifier.report_path, task.verifier.timeout_s) == (
        "junit",
        "junit.xml",
        60.0,
    )
    assert (task.limits.max_turns, task.limits.memory_mb) == (20, 1024)
    assert task.metadata == {"difficulty": "easy"}
    assert task.source_dir == str((DATA / "gyre-add").resolve())
    assert task.unsupported is None


@pytest.mark.parametrize("name", ["humanize", "retrying"])
def test_real_nl2repo_folders_load(name: str, tmp_path: Path) -> None:
    folder = public_folder(name, tmp_path)
    task = load_task(folder)
    assert task.id == name and task.format == "nl2repo"
    assert task.instruction.strip() and task.instruction == (folder / "start.md").read_text()
    assert task.verifier is not None and task.verifier.result == "junit"
    commands = json.loads((folder / "test_commands.json").read_text())
    assert task.verifier.commands == tuple(commands)  # verbatim shell strings, not split on spaces
    assert all(isinstance(c, str) and " " in c for c in task.verifier.commands)
    assert task.verifier.declared_test_count == int((folder / "test_case_count.txt").read_text())
    assert task.verifier.report_path == ""  # pytest's own report, through PYTEST_ADDOPTS
    assert "**/conftest.py" in task.verifier.remove  # an agent's conftest cannot steer the grading
    # the public folders name hidden tests without shipping them: recorded, and the task flagged
    assert task.missing_hidden_files == tuple(json.loads((folder / "test_files.json").read_text()))
    assert task.hidden_files == {} and task.files == {}
    assert task.unsupported is not None and "not shipped" in task.unsupported


def test_nl2repo_task_with_shipped_tests_is_runnable(tmp_path: Path) -> None:
    _write_nl2repo(tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_a():\n    pass\n")
    task = load_task(tmp_path)
    assert task.hidden_files == {"tests/test_a.py": "def test_a():\n    pass\n"}
    assert task.missing_hidden_files == () and task.unsupported is None
    assert task.verifier is not None and task.verifier.commands == (
        "pip install -e . && pytest tests > log 2>&1",
    )


def test_a_setuptools_graders_requirements_are_read_not_run(tmp_path: Path) -> None:
    """Issue 32: setup.py's install_requires was never read, so a setup.py project needed a hand-written
    environment.toml. Read statically (literals, a module-level name, test extras), with setup.cfg's and the
    requirements.txt a setup.py reads; nothing of setup.py runs (its side effect would fail the load), and what is
    not a requirement (tsfresh's setup.cfg interpolates `%(dask)s`) is left out rather than failing the load."""
    _write_nl2repo(tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_a():\n    pass\n")
    (tmp_path / "grader").mkdir()
    (tmp_path / "grader" / "setup.py").write_text(
        "import sys\nfrom setuptools import setup\n"
        "DEPS = ['attrs>=21', 'click']\n"
        "if 'run' in sys.argv: raise SystemExit('setup.py was run')\n"
        "with open('requirements.txt') as f: reqs = f.read().splitlines()\n"
        "setup(name='demo', install_requires=DEPS + reqs, tests_require=['pytest-mock'],\n"
        "      extras_require={'test': ['freezegun'], 'docs': ['sphinx']})\n"
    )
    (tmp_path / "grader" / "requirements.txt").write_text("# runtime\nsix>=1.7.0\n-r other.txt\n")
    (tmp_path / "grader" / "setup.cfg").write_text(
        "[options]\ninstall_requires =\n    packaging\n    %(dask)s\n[options.extras_require]\ntesting = hypothesis\n"
    )
    task = load_task(tmp_path)
    assert task.environment is not None
    assert set(task.environment.requirements) == {
        "setuptools", "attrs>=21", "click", "pytest-mock", "freezegun", "six>=1.7.0", "packaging", "hypothesis",
        "pytest>=8,<9",  # the benchmark's images ran pytest 8 (9 refuses py.path hook arguments)
    }  # fmt: skip


SPEC_ENVIRONMENT = """\
## Environment Configuration

### Python Version

The Python version used in the current project is: Python 3.10.11

## Core Dependency Library Versions

```Plain
# Core security library
MarkupSafe>=3.0                    # HTML safe string processing

# Testing frameworks
trio                               # Asynchronous testing support
path-dict~=3.0.4
os>=1.0.0                          # the standard library, listed as a dependency (autojump's spec)
pytest>=6.0                        # Unit testing framework
sphinx                             # Documentation generator
demo>=1.0                          # the project itself
```

Core dependencies
```
anyio                    4.10.0
httpx                    0.28.1
```

## Project Architecture

```
requests   2.0.0
```
"""


def test_the_test_dependencies_a_task_declares_anywhere_are_found(tmp_path: Path) -> None:
    """Issue 32: a `#` comment in the spec's dependency block was read as a heading that ended the environment
    section (jinja, fastapi-users: no pin read at all), and requirement lines ("trio  # Asynchronous testing
    support") were never read, so tests that import trio, path_dict or httpx could not run. The freeze lines are
    pins; a requirement line, or one of the grader's non-test extras, is installed when the hidden tests import it
    (not the documentation stack, never the project itself, which an extra may name: stamina's empty workspace
    scored 0.72 with the registry's stamina installed); nothing outside the section counts."""
    _write_nl2repo(tmp_path)
    (tmp_path / "start.md").write_text(SPEC_ENVIRONMENT)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text(
        "import os\nimport pytest\nfrom path_dict import PathDict\nimport demo\nimport markupsafe\nimport uuid6\n"
        "import latex2sympy2_extended\nREASON = 'needs pycrypto'\n"
        "import pkg_resources\n\n@pytest.mark.parametrize('anyio_backend', ['asyncio', 'trio'])\ndef test_a():\n"
        "    np = pytest.importorskip('numpy')\n"
    )
    (tmp_path / "grader").mkdir()
    (tmp_path / "grader" / "setup.cfg").write_text(
        "[options.extras_require]\nfast = numpy>=1.20\n    ujson\ndocs = sphinx\n"
    )
    (tmp_path / "grader" / "pyproject.toml").write_text(
        '[project]\nname = "demo"\ndependencies = ["latex2sympy2_extended==1.10.2"]\n'
        '[project.optional-dependencies]\ndev = ["uuid6==2025.0.1", "nox", "demo[tests]", "trio"]\n'
        'antlr4_9_3 = ["latex2sympy2_extended[antlr4_9_3]"]\npycrypto = ["pycrypto>=2.6"]\n'
        '[build-system]\nrequires = ["hatchling", "hatch-vcs"]\nbuild-backend = "hatchling.build"\n'
        '[tool.pytest.ini_options]\naddopts = "-ra --cov=demo --cov-report=term --asyncio-mode=strict"\n'
        "timeout = 30\ntimeout_method = 'thread'\n"
    )
    task = load_task(tmp_path)
    assert task.environment is not None
    assert task.environment.python == "3.10.11"
    # hatch-vcs versions it from git history, which a git archive lacks (an sdist's PKG-INFO would have it)
    assert task.environment.env["SETUPTOOLS_SCM_PRETEND_VERSION"] == "0.0.0"
    assert task.environment.pins == ("anyio==4.10.0", "httpx==0.28.1")
    # deepdiff's tests import uuid6, which only its "dev" extra declares, tqdm's importorskip numpy, which a
    # setup.cfg extra declares; not an alternative build of a dependency (math-verify's antlr4 variants could not be
    # resolved together), nor a backend the tests only mention (python-jose's pycrypto no longer compiles), nor the
    # standard library; pkg_resources is setuptools'
    # the plugins whose options its pytest configuration uses (pytest refuses to start without those of addopts; an
    # unknown ini option is an error under --strict-config)
    assert task.environment.requirements == (
        "MarkupSafe>=3.0", "path-dict~=3.0.4", "pytest>=6.0", "latex2sympy2_extended==1.10.2", "hatchling",
        "hatch-vcs", "editables",
        "uuid6==2025.0.1", "trio", "numpy>=1.20",
        "setuptools<81", "pytest-timeout", "pytest-cov", "pytest-asyncio", "pytest<9",  # "pytest>=6" resolves to 9
    )  # fmt: skip


def test_harbor_task_loads() -> None:
    task = load_task(DATA / "harbor-hello")
    assert (task.id, task.format, task.time_budget_s) == ("harbor-hello", "harbor", 120.0)
    assert task.unsupported is None
    assert set(task.hidden_files) == {"tests/test.sh"} and task.files == {}
    assert task.verifier is not None
    assert (task.verifier.result, task.verifier.report_path) == ("reward_file", "/logs/verifier/reward.txt")
    assert task.verifier.commands == ("bash tests/test.sh",) and task.verifier.timeout_s == 30.0
    assert task.limits.memory_mb == 512
    assert task.metadata == {"author_name": "Gyre", "difficulty": "easy"}


def test_harbor_task_needing_an_image_is_flagged_not_rejected() -> None:
    task = load_task(DATA / "harbor-image")
    assert task.unsupported is not None
    assert "ghcr.io/example/hello:latest" in task.unsupported and "Docker" in task.unsupported


def test_detection() -> None:
    assert detect_format(DATA / "gyre-add") == "gyre"
    assert detect_format(DATA / "harbor-hello") == "harbor"
    assert detect_format(NL2REPO / "retrying") == "nl2repo"


def test_unrecognised_directory(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("hi")
    with pytest.raises(TaskError, match=r"task\.toml.*start\.md"):
        load_task(tmp_path)
    with pytest.raises(TaskError, match="not found"):
        load_task(tmp_path / "nope")


def test_suite_is_sorted_and_skips_non_tasks(tmp_path: Path) -> None:
    for name in ["harbor-hello", "gyre-add"]:
        shutil.copytree(DATA / name, tmp_path / name)
    (tmp_path / "README.md").write_text("a suite")
    (tmp_path / ".cache").mkdir()
    assert [t.id for t in load_suite(tmp_path)] == ["add", "harbor-hello"]


def test_suite_lists_every_bad_task(tmp_path: Path) -> None:
    shutil.copytree(DATA / "gyre-add", tmp_path / "a-good")
    shutil.copytree(DATA / "gyre-add", tmp_path / "b-bad")
    (tmp_path / "b-bad" / "instruction.md").unlink()
    shutil.copytree(DATA / "gyre-add", tmp_path / "c-bad")
    _edit(tmp_path / "c-bad" / "task.toml", "time_budget_s = 300", 'time_budget_s = "soon"')
    shutil.copytree(DATA / "gyre-add", tmp_path / "d-dup")  # same id as a-good
    with pytest.raises(TaskError) as info:
        load_suite(tmp_path)
    message = str(info.value)
    assert "3 bad task(s)" in message
    assert "b-bad/instruction.md: file not found" in message
    assert "c-bad/task.toml: field 'time_budget_s'" in message
    assert "d-dup" in message and "field 'id'" in message


def _write_nl2repo(root: Path) -> None:
    (root / "start.md").write_text("Build a library.")
    (root / "test_commands.json").write_text(json.dumps(["pip install -e . && pytest tests > log 2>&1"]))
    (root / "test_files.json").write_text(json.dumps(["tests/test_a.py"]))
    (root / "test_case_count.txt").write_text("12\n")


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


# (layout, file, break it, the field the message must name)
MALFORMED = {
    "gyre missing instruction": ("gyre", "instruction.md", lambda p: p.unlink(), "file not found"),
    "gyre empty instruction": ("gyre", "instruction.md", lambda p: p.write_text("  \n"), "'instruction'"),
    "gyre invalid toml": ("gyre", "task.toml", lambda p: p.write_text("id = \n"), "invalid TOML"),
    "gyre missing verifier": ("gyre", "task.toml", lambda p: p.write_text('id = "x"\n'), "'verifier'"),
    "gyre negative budget": (
        "gyre",
        "task.toml",
        lambda p: _edit(p, "time_budget_s = 300", "time_budget_s = -5"),
        "'time_budget_s'",
    ),
    "gyre budget wrong type": (
        "gyre",
        "task.toml",
        lambda p: _edit(p, "time_budget_s = 300", 'time_budget_s = "1h"'),
        "'time_budget_s'",
    ),
    "gyre id wrong type": ("gyre", "task.toml", lambda p: _edit(p, 'id = "add"', "id = 7"), "'id'"),
    "gyre unknown field": (
        "gyre",
        "task.toml",
        lambda p: _edit(p, "max_turns", "max_turn"),
        "'limits.max_turn'",
    ),
    "gyre bad result kind": (
        "gyre",
        "task.toml",
        lambda p: _edit(p, 'result = "junit"', 'result = "stdout"'),
        "'verifier.result'",
    ),
    "gyre reward file without path": (
        "gyre",
        "task.toml",
        lambda p: (_edit(p, 'report_path = "junit.xml"', ""), _edit(p, '"junit"', '"reward_file"')),
        "'verifier.report_path'",
    ),
    "gyre commands not strings": (
        "gyre",
        "task.toml",
        lambda p: _edit(p, 'commands = ["python', 'commands = [1, "python'),
        "'verifier.commands",
    ),
    "gyre no commands": (
        "gyre",
        "task.toml",
        lambda p: _edit(p, 'commands = ["python -m pytest -q tests --junitxml=junit.xml"]', "commands = []"),
        "'verifier.commands'",
    ),
    "gyre negative memory": (
        "gyre",
        "task.toml",
        lambda p: _edit(p, "memory_mb = 1024", "memory_mb = -1"),
        "'limits.memory_mb'",
    ),
    "nl2repo missing start": ("nl2repo", "start.md", lambda p: p.unlink(), "file not found"),
    "nl2repo missing commands": ("nl2repo", "test_commands.json", lambda p: p.unlink(), "file not found"),
    "nl2repo invalid json": (
        "nl2repo",
        "test_commands.json",
        lambda p: p.write_text('["pip'),
        "invalid JSON",
    ),
    "nl2repo commands not a list": (
        "nl2repo",
        "test_commands.json",
        lambda p: p.write_text('"pytest"'),
        "'test_commands'",
    ),
    "nl2repo command not a string": (
        "nl2repo",
        "test_commands.json",
        lambda p: p.write_text('["pytest", 3]'),
        "'test_commands[1]'",
    ),
    "nl2repo files not a list": ("nl2repo", "test_files.json", lambda p: p.write_text("{}"), "'test_files'"),
    "nl2repo file escapes": (
        "nl2repo",
        "test_files.json",
        lambda p: p.write_text('["../secret.py"]'),
        "'test_files[0]'",
    ),
    "nl2repo count not integer": (
        "nl2repo",
        "test_case_count.txt",
        lambda p: p.write_text("about 20"),
        "'test_case_count'",
    ),
    "nl2repo count negative": (
        "nl2repo",
        "test_case_count.txt",
        lambda p: p.write_text("-3"),
        "'test_case_count'",
    ),
    "nl2repo missing count": ("nl2repo", "test_case_count.txt", lambda p: p.unlink(), "file not found"),
    "harbor missing instruction": ("harbor", "instruction.md", lambda p: p.unlink(), "file not found"),
    "harbor timeout wrong type": (
        "harbor",
        "task.toml",
        lambda p: _edit(p, "timeout_sec = 120.0", 'timeout_sec = "2m"'),
        "'agent.timeout_sec'",
    ),
    "harbor negative timeout": (
        "harbor",
        "task.toml",
        lambda p: _edit(p, "timeout_sec = 30.0", "timeout_sec = -1.0"),
        "'verifier.timeout_sec'",
    ),
}


@pytest.mark.parametrize("case", MALFORMED.values(), ids=list(MALFORMED))
def test_malformed_task_names_file_and_field(tmp_path: Path, case: tuple) -> None:
    layout, file, breaker, expected = case
    root = tmp_path / "task"
    if layout == "nl2repo":
        root.mkdir()
        _write_nl2repo(root)
    else:
        shutil.copytree(DATA / ("gyre-add" if layout == "gyre" else "harbor-hello"), root)
    breaker(root / file)
    with pytest.raises(TaskError) as info:
        load_task(root)
    message = str(info.value)
    assert str(root / file) in message
    assert expected in message

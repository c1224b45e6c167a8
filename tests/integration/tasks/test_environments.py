"""Task environments (`gyre tasks prepare`): built once from what a task declares, shared, shown read-only to
sandboxes under a writable layer of each sandbox's own, and a task whose environment cannot be built is refused
with the installer's reason. Builds use the package registry (cached by uv after the first run)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gyre.cli import main
from gyre.config import SandboxConfig
from gyre.errors import TaskError
from gyre.sandbox import make_sandbox
from gyre.tasks import environments
from gyre.tasks.formats import load_task
from gyre.tasks.task import EnvironmentSpec
from gyre.tasks.verify import Verifier

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "nl2repobench"  # start.md copied unchanged
SPEC = EnvironmentSpec(pins=("six==1.17.0",))


def nl2repo_task(root: Path, environment: str = "") -> Path:
    root.mkdir(parents=True)
    (root / "start.md").write_text(
        "# lib\n\n## Environment Configuration\n\n### Python Version\n\nPython 3.11\n\n"
        "### Core Dependency Library Versions\n\n```Plain\nsix    1.17.0\n```\n\n## API\n"
    )
    (root / "test_commands.json").write_text(json.dumps(["pytest tests"]))
    (root / "test_files.json").write_text(json.dumps(["tests"]))
    (root / "test_case_count.txt").write_text("1")
    (root / "tests").mkdir()
    (root / "tests" / "test_lib.py").write_text(
        "import six\nfrom lib import f\n\ndef test_f():\n    assert f() == 1\n"
    )
    (root / "solution").mkdir()
    (root / "solution" / "lib.py").write_text("def f():\n    return 1\n")
    if environment:
        (root / "environment.toml").write_text(environment)
    return root


def test_a_spec_section_becomes_pins_and_directories_of_hidden_tests_load(tmp_path: Path) -> None:
    task = load_task(FIXTURES / "humanize")
    assert task.environment is not None and task.environment.python == "3.10.11"
    assert "freezegun==1.5.5" in task.environment.pins and len(task.environment.pins) == 59
    assert task.environment.env["PYTHONPATH"] == "{workspace}"  # as the benchmark's images set it
    local = load_task(nl2repo_task(tmp_path / "t"))
    assert local.unsupported is None and "tests/test_lib.py" in local.hidden_files  # "tests": a directory


def test_installer_options_are_refused_as_requirements(tmp_path: Path) -> None:
    root = nl2repo_task(
        tmp_path / "t", '[environment]\nrequirements = ["--index-url=http://attacker.example"]\n'
    )
    with pytest.raises(TaskError, match=r"environment.requirements\[0\].*not a requirement"):
        load_task(root)


def test_preparing_twice_does_no_work_and_the_environment_is_shared(tmp_path: Path) -> None:
    cfg = SandboxConfig(env_cache_dir=str(tmp_path / "cache"))
    first, built = environments.prepare(SPEC, cfg)
    assert built and any(line.startswith("six==1.17.0") for line in first.installed)
    again, built_again = environments.prepare(SPEC, cfg)
    assert not built_again and again.path == first.path  # a lookup
    same = EnvironmentSpec(pins=("six == 1.17.0",), env={"X": "1"})  # the same packages: the same directory
    assert environments.environment_key(same) == first.key
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()) == [first.key]


def test_pip_install_in_a_sandbox_goes_into_its_own_layer_offline(tmp_path: Path) -> None:
    cfg = SandboxConfig(env_cache_dir=str(tmp_path / "cache"))
    env = Path(environments.prepare(SPEC, cfg)[0].path)
    before = sorted(p.name for p in Path(env, "lib").rglob("*"))
    project = (
        "mkdir -p p/mp && echo 'X = 1' > p/mp/__init__.py && printf '[build-system]\\nrequires = [\"setuptools\"]\\n"
        'build-backend = "setuptools.build_meta"\\n[project]\\nname = "mp"\\nversion = "0.1"\\n'
        'dependencies = ["six"]\\n\' > p/pyproject.toml'
    )

    async def run() -> tuple[str, str, int]:
        async with make_sandbox(cfg, python_env=env) as one, make_sandbox(cfg, python_env=env) as other:
            installed = await one.exec(
                f"{project} && cd p && pip install -e . && cd / && python -c 'import mp, six'"
            )
            assert installed.exit_code == 0, installed.stdout + installed.stderr
            seen = await other.exec("python -c 'import mp'")
            shared = await one.exec(f"touch {env}/x")
            return installed.stdout, seen.stderr, shared.exit_code

    stdout, other_sees, write_shared = asyncio.run(run())
    assert "Successfully installed mp-0.1" in stdout  # six came from the environment: no index, no network
    assert "No module named 'mp'" in other_sees  # the other sandbox's layer is its own
    assert write_shared != 0 and sorted(p.name for p in Path(env, "lib").rglob("*")) == before


def test_a_task_whose_environment_cannot_be_built_is_refused_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = nl2repo_task(
        tmp_path / "suite" / "broken", '[environment]\nrequirements = ["gyre-no-such-package-zz==1.0"]\n'
    )
    nl2repo_task(tmp_path / "suite" / "fine")
    environments.forget()
    cache = f'sandbox.env_cache_dir="{tmp_path / "cache"}"'
    code = main(["tasks", "prepare", str(root.parent), "--set", cache, "--no-progress"])
    out = capsys.readouterr()
    assert code == 1 and "1 of 2 task(s) refused" in out.err
    assert "gyre-no-such-package-zz" in out.out and "could not be built" in out.out
    text = " ".join(out.out.split())  # the table folds long cells
    assert "(environment)" in text and "the package registry has no gyre-no-such-package-zz" in text
    # preparing again builds nothing for the task that worked
    assert main(["tasks", "prepare", str(tmp_path / "suite" / "fine"), "--set", cache, "--no-progress"]) == 0
    assert "cached" in capsys.readouterr().out


def test_prepare_refuses_what_it_can_before_building_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32: `gyre tasks prepare` built each task's environment (some with torch) before refusing the task.
    A public NL2RepoBench folder (its hidden tests are in the benchmark's images) is refused unbuilt."""
    suite = tmp_path / "suite"
    suite.mkdir()
    for name in ("humanize", "retrying"):  # unchanged public folders: 59 and 12 pins, no hidden tests
        for file in (FIXTURES / name).iterdir():
            if file.is_file() and not file.name.endswith(".py") and file.name != "UPSTREAM.md":
                (suite / name).mkdir(exist_ok=True)
                (suite / name / file.name).write_bytes(file.read_bytes())
    environments.forget()
    cache = tmp_path / "cache"
    code = main(
        ["tasks", "prepare", str(suite), "--set", f'sandbox.env_cache_dir="{cache}"', "--no-progress"]
    )
    out = capsys.readouterr()
    assert code == 1 and "2 of 2 task(s) refused" in out.err
    assert out.out.count("not shipped") == 2 and "not built" in out.out and "(hidden tests)" in out.out
    assert not cache.exists() or not any(cache.rglob("*.json")), sorted(cache.rglob("*"))[:5]


def test_a_reference_that_cannot_be_collected_names_the_install_step_that_failed(tmp_path: Path) -> None:
    """Issue 32: a refusal read "...: py:5: in <module>" and never mentioned the `pip install -e .` that failed."""
    root = nl2repo_task(tmp_path / "t")
    (root / "test_commands.json").write_text(json.dumps(["pip install -e .", "pytest tests"]))
    (root / "grader").mkdir()
    (root / "grader" / "setup.py").write_text("raise SystemExit('setup.py: README.rst is missing')\n")
    (root / "solution" / "lib.py").write_text("raise RuntimeError('the reference is broken')\n")
    task = load_task(root)
    environments.forget()
    with pytest.raises(TaskError) as refused:
        asyncio.run(Verifier(SandboxConfig(), retries=0).preflight(task))
    message = str(refused.value)
    assert message.startswith("task t (reference): the hidden tests cannot be collected"), message[:300]
    assert "`pip install -e .` exited 1" in message and "README.rst is missing" in message, message[:1500]


def test_a_collection_error_behind_a_long_warnings_summary_is_still_named(tmp_path: Path) -> None:
    """Issue 32: flasky's refusal quoted only its warnings summary (the last 2,000 characters of the output), never
    why its five test files failed to collect; a missing module there was not recognised either."""
    root = nl2repo_task(tmp_path / "t")
    (root / "tests" / "test_lib.py").write_text(
        "import six\nimport not_declared_anywhere\nfrom lib import f\n\ndef test_f():\n    assert f() == 1\n"
    )
    (root / "tests" / "test_noisy.py").write_text(
        "import warnings\n\nfor i in range(80):\n"
        "    warnings.warn(f'deprecated thing number {i}: ' + 'x' * 60, DeprecationWarning)\n\n"
        "def test_quiet():\n    pass\n"
    )
    task = load_task(root)
    with pytest.raises(TaskError) as refused:
        asyncio.run(Verifier(SandboxConfig(), retries=0).preflight(task))
    message = str(refused.value)
    assert message.startswith("task t (hidden tests): they import not_declared_anywhere"), message[:1500]

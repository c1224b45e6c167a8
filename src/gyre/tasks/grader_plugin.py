"""Gyre's pytest plugin for grading: it reports each hidden test's outcome to the host and trips on tampering.

Not imported by Gyre itself: the verifier copies this file, as ``gyre_grader.py``, into a read-only grader
directory outside the workspace and loads it into the graded pytest with ``-p gyre_grader``, before any code of
the agent's runs (plugin autoload is off, no config file of the workspace is read). It depends on nothing but the
standard library and pytest.

The channel: the host writes a 32-byte key into the FIFO ``$GYRE_GRADER_KEY``; the grader's launcher
(`gyre.tasks.grader_launch`, the commands' ``pytest``) reads it before anything else runs and hands it over in
``sys``; a pytest started another way reads the FIFO at import (a later one finds none and stays silent), so
afterwards it lives only in this process's memory. Each event is one line on the FIFO ``$GYRE_GRADER_REPORT``,
which the host reads as it arrives: ``<hmac> <json>``, the JSON numbered from 0 (``n``) and the HMAC-SHA256 of the
JSON under the key. Events: ``start``, ``collect_error`` (a collector that failed), ``collected`` (with
``--collect-only``), ``test`` (a test's outcome after its teardown), ``tampered`` (a tripwire below fired) and
``finish``. The host treats a line it cannot authenticate, a gap in the numbering, or
anything after ``finish`` as tampering: a report rewritten at exit or forged without the key is caught.

Tripwires, captured at import and checked at every test report and at the end of the session: the functions that
run tests and build their reports, the registered plugins and the hook implementations of the reporting hooks (only
the grader's installation and the task's own conftest files may add any), the builtins (between tests: a test may
monkeypatch them), trace and profile functions, and the code of each hidden test and of each function, fixture and
method of its file against what its source (read at import) compiles to. Code of the agent's runs in this process,
so a determined attacker aiming at this plugin (reading the key from its memory, disarming its checks) can still
forge a report; these checks make the known routes visible.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import hmac
import importlib
import inspect
import json
import os
import sys
import threading
import types
from typing import Any

import pytest
from _pytest.assertion.rewrite import rewrite_asserts
from _pytest.reports import TestReport  # pytest < 7 has no pytest.TestReport

_write, _open, _read, _close, _getpid = (
    os.write,
    os.open,
    os.read,
    os.close,
    os.getpid,
)  # bound before agent code
_hmac_new, _sha256, _dumps = hmac.new, hashlib.sha256, json.dumps
# the interpreter's own module registry: a test may rebind ``sys.modules`` (structlog's monkeypatches it to {})
_MODULES = sys.modules
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grader.json"), encoding="utf-8") as _file:
    _CONFIG: dict[str, Any] = json.load(_file)
KEY_BYTES = 32
MAX_ID_CHARS = 2000  # a line stays below PIPE_BUF (4096 bytes), so concurrent writes never interleave in one

# The functions that decide whether a test passed and what is reported (module, attribute path).
GUARDED = (
    ("_pytest.runner", "call_and_report"), ("_pytest.runner", "runtestprotocol"),
    ("_pytest.runner", "pytest_runtest_protocol"), ("_pytest.runner", "pytest_runtest_makereport"),
    ("_pytest.runner", "pytest_runtest_call"), ("_pytest.runner", "pytest_runtest_setup"),
    ("_pytest.runner", "pytest_runtest_teardown"), ("_pytest.runner", "call_runtest_hook"),
    ("_pytest.runner", "CallInfo.from_call"), ("_pytest.runner", "pytest_make_collect_report"),
    ("_pytest.runner", "collect_one_node"),
    ("_pytest.reports", "TestReport.__init__"), ("_pytest.reports", "TestReport.from_item_and_call"),
    ("_pytest.reports", "CollectReport.__init__"), ("_pytest.reports", "BaseReport.passed"),
    ("_pytest.reports", "BaseReport.failed"), ("_pytest.reports", "BaseReport.skipped"),
    ("_pytest.python", "Function.runtest"), ("_pytest.python", "Function.setup"),
    ("_pytest.python", "pytest_pyfunc_call"), ("_pytest.python", "Module.collect"),
    ("_pytest.main", "pytest_runtestloop"), ("_pytest.main", "Session.perform_collect"),
    ("_pytest.skipping", "pytest_runtest_makereport"), ("_pytest.skipping", "pytest_runtest_setup"),
    ("_pytest.skipping", "pytest_runtest_call"), ("_pytest.outcomes", "fail"), ("_pytest.outcomes", "skip"),
    ("_pytest.outcomes", "xfail"), ("_pytest.outcomes", "exit"), ("_pytest.raises", "raises"),
    ("_pytest.python_api", "raises"), ("_pytest.approx", "approx"), ("_pytest.python_api", "approx"),
    ("_pytest.fixtures", "FixtureDef.execute"), ("_pytest.fixtures", "call_fixture_func"),
    ("_pytest.unittest", "TestCaseFunction.runtest"), ("_pytest.config", "PytestPluginManager.register"),
    *(("unittest.case", f"TestCase.{name}") for name in (
        "run", "__call__", "_callTestMethod", "fail", "assertEqual", "assertNotEqual", "assertTrue", "assertFalse",
        "assertIs", "assertIsNone", "assertIn", "assertRaises", "assertAlmostEqual", "assertDictEqual",
        "assertListEqual", "assertSequenceEqual", "assertCountEqual", "_baseAssertEqual", "_getAssertEqualityFunc",
    )),
    ("pluggy._callers", "_multicall"), ("pluggy._hooks", "HookCaller.__call__"),
    ("pluggy._manager", "PluginManager._hookexec"), ("builtins", "compile"), ("builtins", "exec"),
)  # fmt: skip
# the builtins module's own metadata, which importing machinery may rebind (six's tests do): no test's outcome reads it
MODULE_METADATA = frozenset({"__name__", "__doc__", "__package__", "__loader__", "__spec__"})
HOOKS = (
    "pytest_runtest_protocol", "pytest_runtest_setup", "pytest_runtest_call", "pytest_runtest_teardown",
    "pytest_runtest_makereport", "pytest_runtest_logreport", "pytest_pyfunc_call", "pytest_report_teststatus",
    "pytest_make_collect_report", "pytest_collectreport", "pytest_collection_modifyitems", "pytest_runtestloop",
    "pytest_sessionfinish", "pytest_pycollect_makeitem", "pytest_generate_tests", "pytest_itemcollected",
)  # fmt: skip


def _resolve(module: str, path: str) -> object:
    """At import: may import. Later (checks run while a test's fixtures are set up): never imports, and reads the
    interpreter's own registry, not ``sys.modules``, which a test may have replaced."""
    obj: object = _MODULES[module] if _grader_started else importlib.import_module(module)
    for part in path.split("."):
        obj = inspect.getattr_static(obj, part)
    return obj


_grader_started = False


def _snapshot() -> list[tuple[str, str, object]]:
    out = []
    for module, path in GUARDED:
        try:
            out.append((module, path, _resolve(module, path)))
        except (ImportError, AttributeError):
            continue  # not in this pytest's version
    return out


class _Grader:
    """The channel to the host and the tripwires (one per pytest process)."""

    def __init__(self) -> None:
        self.key = self._take_key()
        self.fd = -1
        self.n = 0
        self.finished = False
        self.guarded = _snapshot()
        self.builtins = dict(vars(builtins))
        # where the grader's interpreter, pytest and the declared plugins live (read-only to the sandbox)
        trusted = _CONFIG.get("trusted") or (sys.prefix, sys.base_prefix)
        self.trusted_dirs = tuple({os.path.realpath(p) + os.sep for p in trusted})
        self.allowed_conftests = {
            os.path.realpath(os.path.join(_CONFIG["rootdir"], p)) for p in _CONFIG["conftests"]
        }
        # the hidden test files as they were before any code of the agent's ran: what their tests' code must be
        self.sources: dict[str, bytes] = {}
        for rel in _CONFIG["tests"]:
            path = os.path.realpath(os.path.join(_CONFIG["rootdir"], rel))
            try:
                with open(path, "rb") as f:
                    self.sources[path] = f.read()
            except OSError:
                continue
        self.pristine: dict[str, dict[tuple[str, int], list[types.CodeType]]] = {}
        self.trees: dict[str, list[ast.stmt]] = {}
        self.bodies: dict[str, dict[str, set[str]]] = {}
        self.config: Any = None
        self.tripped: set[str] = set()
        self.phases: dict[str, str] = {}  # nodeid -> the worst outcome of its phases so far
        self.code: dict[str, object] = {}  # nodeid -> its test function's code, at collection
        self.current: str | None = None  # the test whose run protocol is under way
        self.nested = 0  # pytest sessions a test started in this process, under way
        self.modules: list[types.ModuleType] = []  # the collected test modules
        self.pm: Any = None
        self.start_plugins: set[int] = set()
        self.start_impls: dict[str, list[object]] = {}
        if self.key:
            self.fd = _open(os.environ["GYRE_GRADER_REPORT"], os.O_WRONLY)
            self.emit("start", pid=_getpid(), pytest=pytest.__version__)

    @staticmethod
    def _take_key() -> bytes:
        if "_gyre_grader_key" in vars(sys):  # started by the grader's launcher, which read it first
            key = vars(sys).pop("_gyre_grader_key")
            return key if isinstance(key, bytes) and len(key) == KEY_BYTES else b""
        path = os.environ.get("GYRE_GRADER_KEY", "")
        if not path:
            return b""
        try:
            fd = _open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return b""
        try:
            key = _read(fd, KEY_BYTES)
        except BlockingIOError:
            key = b""  # another pytest process of this command took it
        finally:
            _close(fd)
        return key if len(key) == KEY_BYTES else b""

    def emit(self, event: str, **fields: object) -> None:
        if self.fd < 0:
            return
        text = _dumps({"n": self.n, "e": event, **fields}, separators=(",", ":"))
        mac = _hmac_new(self.key, text.encode(), _sha256).hexdigest()
        self.n += 1
        _write(self.fd, f"{mac} {text}\n".encode())

    def trip(self, why: str) -> None:
        if why not in self.tripped:
            self.tripped.add(why)
            self.emit("tampered", why=why)

    def watch(self, pm: Any) -> None:
        """Start watching the plugin manager (before any conftest or test module is imported)."""
        self.pm = pm
        self.start_plugins = {id(p) for p in pm.get_plugins()}
        self.start_impls = {h: self._impls(h) for h in HOOKS}

    def _impls(self, hook: str) -> list[object]:
        caller = getattr(self.pm.hook, hook, None)
        return [] if caller is None else [i.function for i in caller.get_hookimpls()]

    def _trusted(self, obj: object) -> bool:
        """A plugin or hook function defined by the grader's installation or the task's hidden conftest files."""
        module = obj if inspect.ismodule(obj) else _MODULES.get(getattr(obj, "__module__", "") or "")
        if obj is _MODULES.get(__name__) or (module is not None and module is _MODULES.get(__name__)):
            return True
        file = os.path.realpath(getattr(module, "__file__", None) or "/")
        return file in self.allowed_conftests or file.startswith(self.trusted_dirs)

    def check(self, between_tests: bool) -> None:
        """Fire the tripwires that something changed since import (``between_tests``: no test's fixtures are set up,
        so the builtins a test may monkeypatch must be back)."""
        for module, path, original in self.guarded:
            try:
                now = _resolve(module, path)
            except (ImportError, AttributeError, KeyError):
                now = None
            if now is not original:
                self.trip(f"{module}.{path} was replaced")
        now = vars(builtins)
        for name, original in self.builtins.items() if between_tests else ():
            if now.get(name) is not original and name not in MODULE_METADATA:
                self.trip(f"builtins.{name} was replaced")
        tracers = (sys.gettrace(), sys.getprofile(), threading.gettrace(), threading.getprofile())
        for tracer in tracers:  # a tracer can jump over a test's assertions
            if tracer is not None and not (self._trusted(tracer) or self._trusted(type(tracer))):
                self.trip("a trace or profile function of the agent's is installed")
        if self.pm is None:
            return
        for plugin in self.pm.get_plugins():
            if id(plugin) not in self.start_plugins and not self._trusted(plugin):
                self.trip(f"a plugin of the agent's was registered: {self.pm.get_name(plugin)}")
        for hook, before in self.start_impls.items():
            for function in self._impls(hook):
                if function not in before and not self._trusted(function):
                    self.trip(f"a hook implementation of the agent's was added to {hook}")

    def _pristine(self, path: str) -> dict[tuple[str, int], list[types.CodeType]]:
        """The code objects of a hidden test file compiled from its source as pytest compiles it (asserts rewritten
        or not), by (qualified name, first line)."""
        if path not in self.pristine:
            table: dict[tuple[str, int], list[types.CodeType]] = {}
            for rewrite in (True, False):
                tree = ast.parse(self.sources[path], filename=path)
                if rewrite:
                    rewrite_asserts(tree, self.sources[path], path, self.config)
                stack = [compile(tree, path, "exec", dont_inherit=True)]
                while stack:
                    code = stack.pop()
                    table.setdefault((_qualname(code), code.co_firstlineno), []).append(code)
                    stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
            self.pristine[path] = table
        return self.pristine[path]

    def check_test(self, item: pytest.Item) -> None:
        """Trip when a hidden test's function is not what its file's source compiles to (or its module's ``pytest``
        is not pytest)."""
        path = os.path.realpath(str(getattr(item, "path", None) or item.fspath))  # pytest < 7 has no .path
        if path not in self.sources:
            return
        module = getattr(getattr(item, "module", None), "__dict__", {})
        if module.get("pytest", pytest) is not pytest:
            self.trip(f"the name pytest in {item.nodeid.split('::')[0]} is not pytest")
        function = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        if getattr(function, "__qualname__", None) in self._implementation_decorated(path, module):
            return  # the source wraps it in the implementation's own decorator: the implementation's to wrap
        if isinstance(getattr(function, "__code__", None), types.CodeType) and not self._as_written(
            function, path
        ):
            self.trip(f"the code of {item.nodeid[:200]} is not its hidden source's")

    def _as_written(self, function: Any, path: str) -> bool:
        """Whether ``function`` is code the hidden file ``path`` (or another hidden file) compiles to, or a wrapper of
        it made by the grader's installation (functools, unittest.mock, hypothesis...); any level of code of the
        agent's is not."""
        for _ in range(32):
            code = getattr(function, "__code__", None)
            handle = getattr(function, "hypothesis", None)  # hypothesis's wrapper takes the test's file name
            handle = handle if handle is not None and self._trusted(type(handle)) else None
            if not isinstance(code, types.CodeType):
                if not self._trusted(type(function)):  # a wrapper object (lru_cache): a library's, or not ok
                    return False
            elif (file := os.path.realpath(code.co_filename)) == path or file in self.sources:
                # the file's own code, or another hidden file's (a mixin's method, a test imported from a helper)
                candidates = self._pristine(file).get((_qualname(code), code.co_firstlineno), [])
                if any(_same_code(code, c) for c in candidates):
                    return True
                if handle is None:
                    return False
            elif not file.startswith(self.trusted_dirs):
                return False
            function = getattr(function, "__wrapped__", None) or getattr(handle, "inner_test", None)
            if function is None:
                return True  # a library's function: nothing of the file's inside
        return False

    def check_module(self, module: types.ModuleType) -> None:
        """Trip when a function, fixture or method a hidden test file defines is not what its source compiles to."""
        path = os.path.realpath(getattr(module, "__file__", None) or "/")
        if path not in self.sources:
            return
        wrapped = self._implementation_decorated(path, vars(module))
        for name in self._defined(path) - wrapped:
            if not self._vouch(vars(module).get(name), module.__name__, path, wrapped):
                self.trip(f"{name} in {os.path.basename(path)} is not what its source defines")

    def _vouch(self, value: object, module: str, path: str, wrapped: set[str]) -> bool:
        """Whether a name the hidden file binds with ``def`` or ``class`` still holds what its source made: its
        function (or a fixture, a decorator's wrapper of it), or its class with the methods its body defines (but
        those in ``wrapped``, which the implementation decorates). A method its body does not define, generated
        from a string (a dataclass's ``__init__``, a NamedTuple's ``__new__``), is the generator's."""
        if isinstance(value, type):
            body = self._class_bodies(path).get(value.__qualname__, set())
            prefix = value.__qualname__ + "."
            own = [(name, getattr(v, "__func__", v)) for name, v in vars(value).items()]
            return value.__module__ == module and all(
                self._as_written(f, path)
                for name, f in own
                if isinstance(f, types.FunctionType)
                and f.__qualname__.startswith(prefix)
                and f.__qualname__ not in wrapped
                and (name in body or not self._generated(f))
            )
        function = getattr(value, "_fixture_function", value)  # pytest's fixture definition
        if isinstance(function, types.FunctionType) or hasattr(function, "__wrapped__"):
            return self._as_written(function, path)
        return self._trusted(type(value))  # e.g. a functools.partial the source made

    def _implementation_decorated(self, path: str, namespace: dict[str, Any]) -> set[str]:
        """Qualified names of the functions, classes and methods the hidden file's source decorates with something of
        the implementation under test (a name its module binds to code outside the grader's installation, e.g. the
        ``@retry`` of a retry library, or freezegun's ``@freeze_time`` on a class, which wraps every method): their
        wrappers are the implementation's code by design."""

        def root(expr: ast.expr) -> str | None:
            while isinstance(expr, ast.Call | ast.Attribute):
                expr = expr.func if isinstance(expr, ast.Call) else expr.value
            return expr.id if isinstance(expr, ast.Name) else None

        def implementation(name: str | None) -> bool:
            value = namespace.get(name or "")
            if value is None or value is pytest:
                return False
            module = (
                value if inspect.ismodule(value) else _MODULES.get(getattr(value, "__module__", "") or "")
            )
            file = os.path.realpath(getattr(module, "__file__", None) or "/")
            return not file.startswith(self.trusted_dirs) and file not in self.sources

        def decorated(node: ast.stmt) -> bool:
            kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            return isinstance(node, kinds) and any(implementation(root(d)) for d in node.decorator_list)

        functions = (ast.FunctionDef, ast.AsyncFunctionDef)
        out: set[str] = set()
        for node in self._tree(path):
            if decorated(node):
                out.add(node.name)  # type: ignore[attr-defined]
            if isinstance(node, ast.ClassDef):
                whole = decorated(node)  # a class decorator may wrap every method
                out |= {
                    f"{node.name}.{item.name}"
                    for item in node.body
                    if isinstance(item, functions) and (whole or decorated(item))
                }
        return out

    def _generated(self, function: Any) -> bool:
        """Whether a function is code generated from a string (``<string>``), or a wrapper of such code made by the
        grader's installation (a dataclass's ``__repr__``), with no file of anyone else's in between."""
        for _ in range(32):
            code = getattr(function, "__code__", None)
            if not isinstance(code, types.CodeType):
                return False
            if not code.co_filename.startswith("<"):
                if not os.path.realpath(code.co_filename).startswith(self.trusted_dirs):
                    return False
                function = getattr(function, "__wrapped__", None)
                if function is None:
                    return False
                continue
            return True
        return False

    def _class_bodies(self, path: str) -> dict[str, set[str]]:
        """The functions each top-level class of a hidden file's source defines in its body, by class name."""
        if path not in self.bodies:
            functions = (ast.FunctionDef, ast.AsyncFunctionDef)
            self.bodies[path] = {
                node.name: {item.name for item in node.body if isinstance(item, functions)}
                for node in self._tree(path)
                if isinstance(node, ast.ClassDef)
            }
        return self.bodies[path]

    def _defined(self, path: str) -> set[str]:
        """The names a hidden file's source binds with ``def`` or ``class`` at its top level."""
        kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        return {node.name for node in self._tree(path) if isinstance(node, kinds)}

    def _tree(self, path: str) -> list[ast.stmt]:
        """The top-level statements of a hidden file's source, parsed once (checks run after every test); none for
        a file that is not Python (a doctest text, a custom collector's data)."""
        if path not in self.trees:
            try:
                self.trees[path] = ast.parse(self.sources[path]).body
            except (SyntaxError, ValueError):
                self.trees[path] = []
        return self.trees[path]

    def report(self, rep: TestReport) -> None:
        """Fold one phase's report into its test's outcome; a test's event goes out after its teardown."""
        kind = type(rep)
        own = kind is TestReport or (issubclass(kind, TestReport) and self._trusted(kind))
        if not own:  # pytest's report, or a subclass of its installation's (a unittest subtest's)
            self.trip(f"a report of type {type(rep).__name__} instead of pytest's")
        if rep.nodeid != self.current:
            self.trip(f"a report for {rep.nodeid[:200]} outside that test's run")
        outcome = "failed" if rep.failed else "skipped" if rep.skipped else "passed"  # an xfail is skipped
        worst = self.phases.get(rep.nodeid)
        if worst == "failed" or (worst == "skipped" and outcome == "passed"):
            outcome = worst
        self.phases[rep.nodeid] = outcome
        if rep.when == "teardown":
            self.emit("test", id=rep.nodeid[:MAX_ID_CHARS], outcome=self.phases.pop(rep.nodeid))


def _qualname(code: types.CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)


def _same_code(a: types.CodeType, b: types.CodeType) -> bool:
    """The same bytecode, names and constants (nested code compared alike)."""
    if (a.co_code, a.co_names, a.co_varnames, len(a.co_consts)) != (
        b.co_code,
        b.co_names,
        b.co_varnames,
        len(b.co_consts),
    ):
        return False
    for x, y in zip(a.co_consts, b.co_consts, strict=True):
        if isinstance(x, types.CodeType) or isinstance(y, types.CodeType):
            if not (isinstance(x, types.CodeType) and isinstance(y, types.CodeType) and _same_code(x, y)):
                return False
        elif type(x) is not type(y) or (x != y and x == x):  # NaN constants compare unequal to themselves
            return False
    return True


_grader = _Grader()
_grader_started = True


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Watch the plugins from here on, then put the task's import paths (the workspace's) on sys.path."""
    if _grader.config is not None:
        return  # a pytest session a test runs in this process (ipytest's): it inherits the options, not the grading
    _grader.watch(early_config.pluginmanager)
    _grader.config = early_config
    # pytest has read the grader's variables: the tests' own subprocesses (a plugin's suite runs pytest in them) get
    # the task's back, so their pytest autoloads its plugins and reads its own configuration, as it would ungraded
    try:
        restore = json.loads(os.environ.pop("GYRE_GRADER_RESTORE", "{}"))
    except ValueError:
        restore = {}
    for name, value in restore.items() if isinstance(restore, dict) else ():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)
    for path in reversed(_CONFIG["pythonpath"]):
        sys.path.insert(0, path)


def pytest_sessionstart(session: pytest.Session) -> None:
    """A test's own pytest session (ipytest runs one per notebook cell) is not the graded one."""
    if session.config is not _grader.config:
        _grader.nested += 1


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed and not _grader.nested:
        _grader.emit("collect_error", id=report.nodeid[:MAX_ID_CHARS])


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config is not _grader.config:
        return
    modules = {}
    for item in session.items:
        _grader.code[item.nodeid] = getattr(getattr(item, "obj", None), "__code__", None)
        _grader.check_test(item)
        module = getattr(item, "module", None)
        if isinstance(module, types.ModuleType):
            modules[id(module)] = module
        if session.config.option.collectonly:  # the host's own clean collection (see gyre.tasks.verify)
            _grader.emit("collected", id=item.nodeid[:MAX_ID_CHARS])
    _grader.modules = list(modules.values())
    for module in _grader.modules:
        _grader.check_module(module)
    _grader.check(between_tests=True)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    if item.config is not _grader.config:
        return (yield)
    if item.nodeid not in _grader.code:
        _grader.trip(f"{item.nodeid[:200]} ran without being collected")
    _grader.current = item.nodeid
    try:
        return (yield)
    finally:
        _grader.current = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    if item.config is not _grader.config:
        return
    code = getattr(getattr(item, "obj", None), "__code__", None)
    if item.nodeid in _grader.code and code is not _grader.code[item.nodeid]:
        _grader.trip(f"the code of {item.nodeid[:200]} was replaced")
    _grader.check_test(item)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _grader.nested:
        return  # a report of the nested session's; ignoring one never raises the score (a test without one fails)
    between_tests = report.when == "teardown"
    _grader.check(between_tests)
    for module in _grader.modules if between_tests else ():
        _grader.check_module(module)
    _grader.report(report)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if session.config is not _grader.config:
        _grader.nested = max(0, _grader.nested - 1)
        return
    _grader.check(between_tests=True)
    for module in _grader.modules:
        _grader.check_module(module)
    _grader.emit("finish", exitstatus=int(exitstatus))
    _grader.finished = True
    if _grader.fd >= 0:
        _close(_grader.fd)
        _grader.fd = -1

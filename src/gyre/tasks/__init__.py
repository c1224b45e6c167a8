"""Tasks: what an execution attempts, loaders for the Gyre, NL2RepoBench and Harbor formats, built-in suites, and
the verifier that scores what an execution built."""

from gyre.tasks.catalog import BUILTIN_SUITES, resolve_suite
from gyre.tasks.formats import load_suite, load_task
from gyre.tasks.task import Task, TaskLimits, VerifierSpec
from gyre.tasks.verify import Verdict, Verifier, VerifierStatistics

__all__ = [
    "BUILTIN_SUITES",
    "Task",
    "TaskLimits",
    "Verdict",
    "Verifier",
    "VerifierSpec",
    "VerifierStatistics",
    "load_suite",
    "load_task",
    "resolve_suite",
]

"""Tasks: what an execution attempts, and loaders for the Gyre, NL2RepoBench and Harbor directory formats."""

from gyre.tasks.base import Task, TaskLimits, VerifierSpec
from gyre.tasks.formats import load_suite, load_task

__all__ = ["Task", "TaskLimits", "VerifierSpec", "load_suite", "load_task"]

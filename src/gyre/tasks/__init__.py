"""Tasks: what an execution attempts. Task suites, formats and verifiers arrive with issue 5."""

from gyre.tasks.base import Task

__all__ = ["Task"]

"""Exception types raised by cronlite."""

from __future__ import annotations


class CronError(ValueError):
    """An invalid cron expression, or a schedule that never fires."""


class FieldError(CronError):
    """One field of a cron expression is invalid."""

    def __init__(self, field: str, text: str, reason: str) -> None:
        super().__init__(f"invalid {field} field {text!r}: {reason}")
        self.field = field
        self.text = text
        self.reason = reason

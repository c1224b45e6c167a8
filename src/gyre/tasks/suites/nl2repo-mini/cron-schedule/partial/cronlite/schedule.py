"""Cron expressions and their fire times."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator

from .errors import CronError
from .fields import FIELD_NAMES, MACROS, parse_field

SEARCH_DAYS = 366 * 10 + 3  # how far next_fire/prev_fire look before giving up
_MINUTE = _dt.timedelta(minutes=1)


def _check(moment) -> _dt.datetime:
    if not isinstance(moment, _dt.datetime):
        raise TypeError(f"expected a datetime, got {type(moment).__name__}")
    if moment.tzinfo is not None and moment.utcoffset() is not None:
        raise ValueError("cronlite works with naive datetimes only")
    return moment


class CronExpression:
    """A parsed 5-field cron expression: minute hour day-of-month month day-of-week."""

    def __init__(self, expression: str) -> None:
        if not isinstance(expression, str):
            raise CronError(f"expected a string, got {type(expression).__name__}")
        self.expression = expression.strip()
        text = self.expression
        if text.startswith("@"):
            if text.lower() not in MACROS:
                raise CronError(f"unknown macro: {text!r}")
            text = MACROS[text.lower()]
        parts = text.split()
        if len(parts) != 5:
            raise CronError(f"expected 5 fields, got {len(parts)}: {self.expression!r}")
        values = [parse_field(p, name) for p, name in zip(parts, FIELD_NAMES)]
        self.fields = tuple(parts)
        self.minutes, self.hours, self.days, self.months, self.weekdays = values
        self._day_star = parts[2].startswith("*")
        self._weekday_star = parts[4].startswith("*")

    def __repr__(self) -> str:
        return f"CronExpression({self.expression!r})"

    def __eq__(self, other):
        if not isinstance(other, CronExpression):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def _key(self):
        return (self.minutes, self.hours, self.days, self.months, self.weekdays, self._day_star, self._weekday_star)

    def matches_date(self, day: _dt.date) -> bool:
        if day.month not in self.months:
            return False
        dom = day.day in self.days
        dow = (day.weekday() + 1) % 7 in self.weekdays
        return dom and dow

    def matches(self, moment: _dt.datetime) -> bool:
        _check(moment)
        return moment.minute in self.minutes and moment.hour in self.hours and self.matches_date(moment.date())

    def next_fire(self, after: _dt.datetime) -> _dt.datetime:
        """The first fire time strictly after ``after``."""
        start = _check(after).replace(second=0, microsecond=0) + _MINUTE
        day = start.date()
        for _ in range(SEARCH_DAYS):
            if self.matches_date(day):
                first = day == start.date()
                for h in self.hours:
                    if first and h < start.hour:
                        continue
                    for m in self.minutes:
                        if first and h == start.hour and m < start.minute:
                            continue
                        return _dt.datetime(day.year, day.month, day.day, h, m)
            day += _dt.timedelta(days=1)
        raise CronError(f"{self.expression!r} does not fire within {SEARCH_DAYS} days after {after}")

    def prev_fire(self, before: _dt.datetime) -> _dt.datetime:
        """The last fire time strictly before ``before``."""
        # TODO: search backwards
        raise NotImplementedError("prev_fire")

    def iter_after(self, start: _dt.datetime) -> Iterator[_dt.datetime]:
        """Successive fire times strictly after ``start`` (endless)."""
        moment = start
        while True:
            moment = self.next_fire(moment)
            yield moment

    def iter_before(self, start: _dt.datetime) -> Iterator[_dt.datetime]:
        """Successive fire times strictly before ``start``, latest first (endless)."""
        moment = start
        while True:
            moment = self.prev_fire(moment)
            yield moment


def parse(expression: str) -> CronExpression:
    """Parse a cron expression (5 fields or an @macro)."""
    return CronExpression(expression)


def _expr(expression) -> CronExpression:
    return expression if isinstance(expression, CronExpression) else CronExpression(expression)


def next_fire(expression, after: _dt.datetime) -> _dt.datetime:
    """``expression`` (str or CronExpression) fired next strictly after ``after``."""
    return _expr(expression).next_fire(after)


def prev_fire(expression, before: _dt.datetime) -> _dt.datetime:
    """``expression`` (str or CronExpression) fired last strictly before ``before``."""
    return _expr(expression).prev_fire(before)

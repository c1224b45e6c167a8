"""cronlite: parse 5-field cron expressions and compute fire times."""

from .errors import CronError, FieldError
from .fields import FIELD_NAMES, MACROS, parse_field
from .schedule import CronExpression, next_fire, parse, prev_fire

__all__ = [
    "FIELD_NAMES",
    "MACROS",
    "CronError",
    "CronExpression",
    "FieldError",
    "next_fire",
    "parse",
    "parse_field",
    "prev_fire",
]

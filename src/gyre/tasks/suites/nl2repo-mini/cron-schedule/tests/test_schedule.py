from datetime import datetime, timedelta, timezone
from itertools import islice

import pytest

from cronlite.errors import CronError, FieldError
from cronlite.schedule import CronExpression, next_fire, parse, prev_fire


def test_parse_attributes():
    c = parse(" 0,30 9-17 * * MON-FRI ")
    assert isinstance(c, CronExpression)
    assert c.expression == "0,30 9-17 * * MON-FRI"
    assert c.minutes == (0, 30)
    assert c.hours == tuple(range(9, 18))
    assert c.days == tuple(range(1, 32))
    assert c.months == tuple(range(1, 13))
    assert c.weekdays == (1, 2, 3, 4, 5)


def test_macro_expands():
    c = parse("@weekly")
    assert c.expression == "@weekly"
    assert (c.minutes, c.hours, c.weekdays) == ((0,), (0,), (0,))
    assert parse("@DAILY") == parse("0 0 * * *")
    assert parse("@midnight") == parse("0 0 * * *")


@pytest.mark.parametrize("text", ["", "* * * *", "* * * * * *", "@reboot", "@every5m", "0 0 1 1"])
def test_bad_expressions(text):
    with pytest.raises(CronError):
        parse(text)


def test_field_error_names_the_field():
    with pytest.raises(FieldError) as info:
        parse("0 25 * * *")
    assert info.value.field == "hour"
    with pytest.raises(FieldError) as info:
        parse("0 0 * FOO *")
    assert info.value.field == "month"


@pytest.mark.parametrize(
    "expr, after, expected",
    [
        ("* * * * *", datetime(2024, 1, 1, 12, 0), datetime(2024, 1, 1, 12, 1)),
        ("* * * * *", datetime(2024, 1, 1, 12, 0, 30, 5), datetime(2024, 1, 1, 12, 1)),
        ("*/15 * * * *", datetime(2024, 1, 1, 12, 7), datetime(2024, 1, 1, 12, 15)),
        ("*/15 * * * *", datetime(2024, 1, 1, 12, 45), datetime(2024, 1, 1, 13, 0)),
        ("30 9 * * *", datetime(2024, 1, 1, 9, 30), datetime(2024, 1, 2, 9, 30)),
        ("30 9 * * *", datetime(2024, 1, 1, 9, 29, 59), datetime(2024, 1, 1, 9, 30)),
        ("0 0 * * *", datetime(2023, 12, 31, 23, 59), datetime(2024, 1, 1, 0, 0)),
        ("0 0 1 * *", datetime(2024, 1, 31, 10, 0), datetime(2024, 2, 1, 0, 0)),
        ("0 12 31 * *", datetime(2024, 4, 1, 0, 0), datetime(2024, 5, 31, 12, 0)),
        ("0 9 * * MON-FRI", datetime(2024, 3, 8, 10, 0), datetime(2024, 3, 11, 9, 0)),
        ("0 0 * * 0", datetime(2024, 3, 6, 0, 0), datetime(2024, 3, 10, 0, 0)),
        ("0 0 * * 7", datetime(2024, 3, 6, 0, 0), datetime(2024, 3, 10, 0, 0)),
        ("15 14 1 * *", datetime(2024, 2, 1, 14, 15), datetime(2024, 3, 1, 14, 15)),
        ("0 0 1 JAN *", datetime(2024, 6, 15, 8, 0), datetime(2025, 1, 1, 0, 0)),
        ("@hourly", datetime(2024, 6, 15, 8, 0), datetime(2024, 6, 15, 9, 0)),
        ("0 0 29 2 *", datetime(2023, 3, 1, 0, 0), datetime(2024, 2, 29, 0, 0)),
        ("0 0 29 2 *", datetime(2097, 3, 1, 0, 0), datetime(2104, 2, 29, 0, 0)),
    ],
)
def test_next_fire(expr, after, expected):
    assert parse(expr).next_fire(after) == expected
    assert next_fire(expr, after) == expected


@pytest.mark.parametrize(
    "expr, before, expected",
    [
        ("* * * * *", datetime(2024, 1, 1, 12, 0), datetime(2024, 1, 1, 11, 59)),
        ("* * * * *", datetime(2024, 1, 1, 12, 0, 0, 1), datetime(2024, 1, 1, 12, 0)),
        ("*/15 * * * *", datetime(2024, 1, 1, 12, 7), datetime(2024, 1, 1, 12, 0)),
        ("30 9 * * *", datetime(2024, 1, 1, 9, 30), datetime(2023, 12, 31, 9, 30)),
        ("30 9 * * *", datetime(2024, 1, 1, 9, 30, 1), datetime(2024, 1, 1, 9, 30)),
        ("0 0 1 * *", datetime(2024, 3, 1, 0, 0), datetime(2024, 2, 1, 0, 0)),
        ("0 12 31 * *", datetime(2024, 5, 1, 0, 0), datetime(2024, 3, 31, 12, 0)),
        ("0 9 * * MON-FRI", datetime(2024, 3, 11, 8, 0), datetime(2024, 3, 8, 9, 0)),
        ("0 0 29 2 *", datetime(2024, 2, 28, 0, 0), datetime(2020, 2, 29, 0, 0)),
        ("@yearly", datetime(2024, 1, 1, 0, 0), datetime(2023, 1, 1, 0, 0)),
    ],
)
def test_prev_fire(expr, before, expected):
    assert parse(expr).prev_fire(before) == expected
    assert prev_fire(expr, before) == expected


def test_day_of_month_or_day_of_week_when_both_restricted():
    # both fields restricted: fires on the 13th OR on any Friday
    c = parse("0 0 13 * FRI")
    fires = list(islice(c.iter_after(datetime(2024, 9, 1)), 5))
    assert fires == [
        datetime(2024, 9, 6),
        datetime(2024, 9, 13),
        datetime(2024, 9, 20),
        datetime(2024, 9, 27),
        datetime(2024, 10, 4),
    ]
    assert c.next_fire(datetime(2024, 10, 4)) == datetime(2024, 10, 11)
    assert c.next_fire(datetime(2024, 10, 11)) == datetime(2024, 10, 13)


def test_star_step_day_field_counts_as_wildcard():
    # the day field starts with '*', so both conditions must hold: odd day AND Monday
    c = parse("0 0 */2 * MON")
    assert c.next_fire(datetime(2024, 1, 1)) == datetime(2024, 1, 15)
    # weekday field is '*': only the day of month matters
    assert parse("0 0 10 * *").next_fire(datetime(2024, 1, 1)) == datetime(2024, 1, 10)


def test_iter_after_and_before():
    c = parse("0 */6 * * *")
    start = datetime(2024, 1, 1, 5, 0)
    assert list(islice(c.iter_after(start), 4)) == [
        datetime(2024, 1, 1, 6),
        datetime(2024, 1, 1, 12),
        datetime(2024, 1, 1, 18),
        datetime(2024, 1, 2, 0),
    ]
    assert list(islice(c.iter_before(start), 3)) == [
        datetime(2024, 1, 1, 0),
        datetime(2023, 12, 31, 18),
        datetime(2023, 12, 31, 12),
    ]


def test_matches():
    c = parse("*/10 8-9 * * MON")
    assert c.matches(datetime(2024, 3, 11, 8, 20))
    assert c.matches(datetime(2024, 3, 11, 9, 50, 59))
    assert not c.matches(datetime(2024, 3, 11, 10, 0))
    assert not c.matches(datetime(2024, 3, 12, 8, 20))
    assert not c.matches(datetime(2024, 3, 11, 8, 25))


def test_never_fires():
    with pytest.raises(CronError):
        parse("0 0 30 2 *").next_fire(datetime(2024, 1, 1))
    with pytest.raises(CronError):
        parse("0 0 31 4,6,9,11 *").prev_fire(datetime(2024, 1, 1))


def test_aware_datetime_rejected():
    aware = datetime(2024, 1, 1, tzinfo=timezone(timedelta(hours=2)))
    with pytest.raises(ValueError):
        parse("* * * * *").next_fire(aware)
    with pytest.raises(ValueError):
        parse("* * * * *").prev_fire(aware)


def test_functions_accept_expression_objects():
    c = parse("0 12 * * *")
    assert next_fire(c, datetime(2024, 1, 1, 12, 0)) == datetime(2024, 1, 2, 12, 0)
    assert prev_fire(c, datetime(2024, 1, 1, 12, 0)) == datetime(2023, 12, 31, 12, 0)

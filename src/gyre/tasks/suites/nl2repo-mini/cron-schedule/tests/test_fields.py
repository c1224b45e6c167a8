import pytest

from cronlite.errors import CronError, FieldError
from cronlite.fields import FIELD_NAMES, MACROS, parse_field


def test_field_names_order():
    assert FIELD_NAMES == ("minute", "hour", "day", "month", "weekday")


@pytest.mark.parametrize(
    "text, field, expected",
    [
        ("*", "hour", tuple(range(24))),
        ("*", "day", tuple(range(1, 32))),
        ("*", "weekday", (0, 1, 2, 3, 4, 5, 6)),
        ("5", "minute", (5,)),
        ("1,15,30", "minute", (1, 15, 30)),
        ("30,1,15,1", "minute", (1, 15, 30)),
        ("9-17", "hour", tuple(range(9, 18))),
        ("*/15", "minute", (0, 15, 30, 45)),
        ("*/5", "hour", (0, 5, 10, 15, 20)),
        ("10-30/10", "minute", (10, 20, 30)),
        ("0-59/20", "minute", (0, 20, 40)),
        ("5/20", "minute", (5, 25, 45)),
        ("*/7", "day", (1, 8, 15, 22, 29)),
        ("1-5,10,20-22", "day", (1, 2, 3, 4, 5, 10, 20, 21, 22)),
        ("JAN", "month", (1,)),
        ("jan,Mar,DEC", "month", (1, 3, 12)),
        ("JUN-AUG", "month", (6, 7, 8)),
        ("*/3", "month", (1, 4, 7, 10)),
        ("MON-FRI", "weekday", (1, 2, 3, 4, 5)),
        ("sun,sat", "weekday", (0, 6)),
        ("7", "weekday", (0,)),
        ("5-7", "weekday", (0, 5, 6)),
        ("MON-WED/2", "weekday", (1, 3)),
    ],
)
def test_parse_field(text, field, expected):
    assert parse_field(text, field) == expected


@pytest.mark.parametrize(
    "text, field",
    [
        ("60", "minute"),
        ("24", "hour"),
        ("0", "day"),
        ("32", "day"),
        ("0", "month"),
        ("13", "month"),
        ("8", "weekday"),
        ("", "minute"),
        ("1,,2", "minute"),
        ("5-1", "hour"),
        ("*/0", "minute"),
        ("*/x", "minute"),
        ("1-", "hour"),
        ("-5", "hour"),
        ("MON", "minute"),
        ("JAN", "weekday"),
        ("FOO", "month"),
        ("1.5", "minute"),
        ("-1", "minute"),
        ("*-5", "hour"),
    ],
)
def test_invalid_fields(text, field):
    with pytest.raises(FieldError) as info:
        parse_field(text, field)
    assert info.value.field == field


def test_field_error_is_cron_error_and_value_error():
    assert issubclass(FieldError, CronError)
    assert issubclass(CronError, ValueError)
    with pytest.raises(FieldError) as info:
        parse_field("99", "minute")
    assert info.value.text == "99"
    assert "minute" in str(info.value)


def test_macros_table():
    assert MACROS["@yearly"] == "0 0 1 1 *"
    assert MACROS["@annually"] == "0 0 1 1 *"
    assert MACROS["@monthly"] == "0 0 1 * *"
    assert MACROS["@weekly"] == "0 0 * * 0"
    assert MACROS["@daily"] == "0 0 * * *"
    assert MACROS["@midnight"] == "0 0 * * *"
    assert MACROS["@hourly"] == "0 * * * *"

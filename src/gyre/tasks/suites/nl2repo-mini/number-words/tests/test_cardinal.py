import pytest

from numwords.cardinal import (
    MAX_VALUE,
    from_words,
    ordinal_suffix,
    to_ordinal,
    to_ordinal_numeral,
    to_words,
)
from numwords.errors import NumWordsError, OutOfRangeError, WordsParseError


@pytest.mark.parametrize(
    "n, expected",
    [
        (0, "zero"),
        (7, "seven"),
        (13, "thirteen"),
        (20, "twenty"),
        (21, "twenty-one"),
        (99, "ninety-nine"),
        (100, "one hundred"),
        (105, "one hundred five"),
        (342, "three hundred forty-two"),
        (1000, "one thousand"),
        (1_000_001, "one million one"),
        (2_000_500_040, "two billion five hundred thousand forty"),
        (-15, "minus fifteen"),
        (
            MAX_VALUE,
            "nine hundred ninety-nine trillion nine hundred ninety-nine billion "
            "nine hundred ninety-nine million nine hundred ninety-nine thousand "
            "nine hundred ninety-nine",
        ),
    ],
)
def test_to_words(n, expected):
    assert to_words(n) == expected


def test_max_value_constant():
    assert MAX_VALUE == 10**15 - 1


@pytest.mark.parametrize("n", [10**15, -(10**15)])
def test_to_words_out_of_range(n):
    with pytest.raises(OutOfRangeError):
        to_words(n)
    assert issubclass(OutOfRangeError, NumWordsError)
    assert issubclass(OutOfRangeError, ValueError)


@pytest.mark.parametrize("value", [1.0, "3", True, None])
def test_to_words_rejects_non_int(value):
    with pytest.raises(TypeError):
        to_words(value)


@pytest.mark.parametrize(
    "n, expected",
    [
        (0, "zeroth"),
        (1, "first"),
        (2, "second"),
        (3, "third"),
        (4, "fourth"),
        (5, "fifth"),
        (8, "eighth"),
        (9, "ninth"),
        (12, "twelfth"),
        (20, "twentieth"),
        (21, "twenty-first"),
        (100, "one hundredth"),
        (1_000_003, "one million third"),
        (90, "ninetieth"),
    ],
)
def test_to_ordinal(n, expected):
    assert to_ordinal(n) == expected


def test_to_ordinal_rejects_negative():
    with pytest.raises(OutOfRangeError):
        to_ordinal(-1)


@pytest.mark.parametrize(
    "n, expected",
    [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"),
     (13, "13th"), (21, "21st"), (112, "112th"), (0, "0th"), (-22, "-22nd")],
)
def test_to_ordinal_numeral(n, expected):
    assert to_ordinal_numeral(n) == expected
    assert ordinal_suffix(n) == expected.lstrip("-0123456789")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("zero", 0),
        ("forty-two", 42),
        ("Twenty-One", 21),
        ("  one   hundred\tfive ", 105),
        ("three hundred forty-two", 342),
        ("one million one", 1_000_001),
        ("two billion five hundred thousand forty", 2_000_500_040),
        ("minus fifteen", -15),
        ("nine hundred", 900),
    ],
)
def test_from_words(text, expected):
    assert from_words(text) == expected


@pytest.mark.parametrize("n", [0, 1, 19, 110, 999, 1_001, 70_000_017, -123_456_789, MAX_VALUE])
def test_round_trip(n):
    assert from_words(to_words(n)) == n


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "minus",
        "minus zero",
        "zero one",
        "one and two",
        "one hundred and five",
        "twenty one",
        "one two",
        "twelve hundred",
        "hundred",
        "thousand",
        "one hundred hundred",
        "one thousand thousand",
        "one thousand one million",
        "one thousand two thousand",
        "twenty-ten",
        "ten-one",
        "twenty-",
        "eleventy",
        "one quadrillion",
    ],
)
def test_from_words_rejects_invalid(text):
    with pytest.raises(WordsParseError):
        from_words(text)


def test_words_parse_error_hierarchy():
    assert issubclass(WordsParseError, NumWordsError)
    assert issubclass(WordsParseError, ValueError)


def test_from_words_rejects_non_str():
    with pytest.raises(TypeError):
        from_words(42)

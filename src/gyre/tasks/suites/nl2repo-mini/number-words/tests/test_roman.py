import pytest

from numwords.errors import NumWordsError, OutOfRangeError, RomanNumeralError
from numwords.roman import from_roman, is_roman, to_roman


@pytest.mark.parametrize(
    "n, expected",
    [
        (1, "I"),
        (3, "III"),
        (4, "IV"),
        (9, "IX"),
        (14, "XIV"),
        (40, "XL"),
        (90, "XC"),
        (400, "CD"),
        (1994, "MCMXCIV"),
        (2024, "MMXXIV"),
        (3999, "MMMCMXCIX"),
    ],
)
def test_to_roman(n, expected):
    assert to_roman(n) == expected
    assert from_roman(expected) == n


@pytest.mark.parametrize("n", [0, -1, 4000])
def test_to_roman_out_of_range(n):
    with pytest.raises(OutOfRangeError):
        to_roman(n)


@pytest.mark.parametrize("value", [2.0, "5", True])
def test_to_roman_rejects_non_int(value):
    with pytest.raises(TypeError):
        to_roman(value)


def test_round_trip_all():
    for n in range(1, 4000):
        assert from_roman(to_roman(n)) == n


@pytest.mark.parametrize(
    "text",
    ["", "IIII", "VV", "IC", "IL", "XM", "VX", "IIV", "XXXX", "MMMM", "LL", "DD",
     "CMC", "XCX", "IXI", "xiv", " XIV", "XIV ", "ABC", "I V"],
)
def test_from_roman_rejects_invalid(text):
    with pytest.raises(RomanNumeralError):
        from_roman(text)
    assert is_roman(text) is False


def test_from_roman_rejects_non_str():
    with pytest.raises(TypeError):
        from_roman(14)


def test_is_roman_true_and_non_str():
    assert is_roman("MCMXCIV") is True
    assert is_roman(None) is False


def test_roman_error_hierarchy():
    assert issubclass(RomanNumeralError, NumWordsError)
    assert issubclass(RomanNumeralError, ValueError)

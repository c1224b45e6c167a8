import pytest

from numwords.compact import compact


@pytest.mark.parametrize(
    "n, expected",
    [
        (0, "0"),
        (7, "7"),
        (999, "999"),
        (1000, "1K"),
        (1200, "1.2K"),
        (1234, "1.2K"),
        (12_345, "12.3K"),
        (3_400_000, "3.4M"),
        (2_000_000_000, "2B"),
        (7_100_000_000_000, "7.1T"),
        (5 * 10**15, "5000T"),
        (-1500, "-1.5K"),
        (12.34, "12.3"),
        (5.0, "5"),
        (2500.0, "2.5K"),
    ],
)
def test_compact_default_precision(n, expected):
    assert compact(n) == expected


@pytest.mark.parametrize(
    "n, precision, expected",
    [
        (1_234_567, 2, "1.23M"),
        (1_234_567, 0, "1M"),
        (1_600_000, 0, "2M"),
        (1_234_567, 3, "1.235M"),
        (1_200_000, 3, "1.2M"),
        (999, 2, "999"),
        (3.14159, 2, "3.14"),
    ],
)
def test_compact_precision(n, precision, expected):
    assert compact(n, precision) == expected
    assert compact(n, precision=precision) == expected


@pytest.mark.parametrize(
    "n, precision, expected",
    [
        (999_949, 1, "999.9K"),
        (999_950, 1, "1M"),
        (999_999, 2, "1M"),
        (999_999_999, 1, "1B"),
        (999.96, 1, "1K"),
        (-999_999, 1, "-1M"),
    ],
)
def test_compact_rolls_over_to_next_suffix(n, precision, expected):
    assert compact(n, precision) == expected


def test_compact_rounded_zero_has_no_sign():
    assert compact(-0.01) == "0"
    assert compact(-0.06) == "-0.1"


def test_compact_negative_precision():
    with pytest.raises(ValueError):
        compact(1000, -1)


@pytest.mark.parametrize("value", ["1000", None, True, [1]])
def test_compact_rejects_non_numbers(value):
    with pytest.raises(TypeError):
        compact(value)


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_compact_rejects_non_finite(value):
    with pytest.raises(ValueError):
        compact(value)

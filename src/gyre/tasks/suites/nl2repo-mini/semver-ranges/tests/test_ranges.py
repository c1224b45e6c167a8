import pytest

from semverlite.errors import InvalidRange, SemverError
from semverlite.ranges import Comparator, Range, max_satisfying, min_satisfying, satisfies


@pytest.mark.parametrize(
    "text, desugared",
    [
        ("1.2.3", "=1.2.3"),
        (">=1.2.7", ">=1.2.7"),
        ("> 1.2.3", ">1.2.3"),
        ("1.2", ">=1.2.0 <1.3.0"),
        ("1.x", ">=1.0.0 <2.0.0"),
        ("*", "*"),
        ("", "*"),
        (">1.2", ">=1.3.0"),
        ("<=1.2", "<1.3.0"),
        ("<1.2", "<1.2.0"),
        (">=1", ">=1.0.0"),
        ("<*", "<0.0.0-0"),
        ("~1.2.3", ">=1.2.3 <1.3.0"),
        ("~1.2", ">=1.2.0 <1.3.0"),
        ("~1", ">=1.0.0 <2.0.0"),
        ("~1.2.3-beta.2", ">=1.2.3-beta.2 <1.3.0"),
        ("^1.2.3", ">=1.2.3 <2.0.0"),
        ("^0.2.3", ">=0.2.3 <0.3.0"),
        ("^0.0.3", ">=0.0.3 <0.0.4"),
        ("^0.0.x", ">=0.0.0 <0.1.0"),
        ("^0.x", ">=0.0.0 <1.0.0"),
        ("^1.2.3-beta.2", ">=1.2.3-beta.2 <2.0.0"),
        ("1.2.3 - 2.3.4", ">=1.2.3 <=2.3.4"),
        ("1.2 - 2.3.4", ">=1.2.0 <=2.3.4"),
        ("1.2.3 - 2.3", ">=1.2.3 <2.4.0"),
        ("1.2.3 - 2", ">=1.2.3 <3.0.0"),
        (">=1.2.7 <1.3.0 || ^2", ">=1.2.7 <1.3.0 || >=2.0.0 <3.0.0"),
    ],
)
def test_desugaring(text, desugared):
    assert str(Range(text)) == desugared


def test_sets_and_comparators():
    r = Range(">=1.2.7 <1.3.0 || 2.x")
    assert len(r.sets) == 2
    first = r.sets[0]
    assert [c.operator for c in first] == [">=", "<"]
    assert str(first[0].version) == "1.2.7"
    assert isinstance(first[1], Comparator)
    assert str(first[1]) == "<1.3.0"


@pytest.mark.parametrize(
    "version, range_text, expected",
    [
        ("1.2.7", ">=1.2.7", True),
        ("1.2.6", ">=1.2.7", False),
        ("1.2.8", ">=1.2.7 <1.3.0", True),
        ("1.3.0", ">=1.2.7 <1.3.0", False),
        ("1.2.7", "1.2.7 || >=1.2.9 <2.0.0", True),
        ("1.2.8", "1.2.7 || >=1.2.9 <2.0.0", False),
        ("1.4.2", "1.2.7 || >=1.2.9 <2.0.0", True),
        ("1.9.9", "^1.2.3", True),
        ("2.0.0", "^1.2.3", False),
        ("0.2.9", "^0.2.3", True),
        ("0.3.0", "^0.2.3", False),
        ("0.0.4", "^0.0.3", False),
        ("1.2.9", "~1.2.3", True),
        ("1.3.0", "~1.2.3", False),
        ("2.3.4", "1.2.3 - 2.3.4", True),
        ("2.3.5", "1.2.3 - 2.3.4", False),
        ("2.3.9", "1.2.3 - 2.3", True),
        ("5.0.0", "*", True),
        ("0.0.0", "<*", False),
        ("1.2.3+build", "1.2.3", True),
        ("v1.2.3", "^1", True),
    ],
)
def test_satisfies(version, range_text, expected):
    assert satisfies(version, range_text) is expected


@pytest.mark.parametrize(
    "version, range_text, expected",
    [
        ("1.2.3-alpha.7", ">1.2.3-alpha.3", True),
        ("3.4.5-alpha.9", ">1.2.3-alpha.3", False),
        ("3.4.5", ">1.2.3-alpha.3", True),
        ("1.2.4-beta.1", "^1.2.3", False),
        ("1.2.3-beta.4", "^1.2.3-beta.2", True),
        ("1.2.4-beta.1", "~1.2.3-beta.2", False),
        ("2.0.0-rc.1", "*", False),
        ("1.3.0-alpha", "1.2.x", False),
        ("2.0.0-rc.1", "<2.0.0", False),
        ("1.0.0-rc.2", "1.0.0-rc.1 - 1.0.0-rc.5", True),
    ],
)
def test_prerelease_rule(version, range_text, expected):
    assert satisfies(version, range_text) is expected


def test_range_object_and_contains():
    r = Range("^1.2.0 || ~3.1")
    assert r.test("1.5.0")
    assert "3.1.9" in r
    assert "3.2.0" not in r
    assert satisfies("1.5.0", r)


def test_invalid_version_argument_does_not_satisfy():
    assert satisfies("1.2", ">=1.0.0") is False
    assert satisfies("not-a-version", "*") is False


@pytest.mark.parametrize(
    "text",
    [">=abc", "^1.2.3.4", "1.2.3 -", "~", ">=1.2.3 - 2.0.0", "1.2.3 - 2.0.0 - 3.0.0", "1.2-beta", "=>1.2.3", "1.2.3 >"],
)
def test_invalid_ranges(text):
    with pytest.raises(InvalidRange):
        Range(text)


def test_invalid_range_is_value_error():
    assert issubclass(InvalidRange, SemverError)
    with pytest.raises(ValueError):
        satisfies("1.0.0", "^^1")


def test_max_and_min_satisfying():
    versions = ["1.2.3", "1.2.4", "1.3.0-beta.1", "1.3.0", "2.0.0", "garbage"]
    assert max_satisfying(versions, "~1.2") == "1.2.4"
    assert max_satisfying(versions, "^1.2.3") == "1.3.0"
    assert min_satisfying(versions, "^1.2.3") == "1.2.3"
    assert max_satisfying(versions, ">=1.3.0-beta.1 <1.3.0") == "1.3.0-beta.1"
    assert max_satisfying(versions, "^3") is None
    assert min_satisfying([], "*") is None


def test_max_satisfying_returns_items_as_given():
    from semverlite.version import Version

    items = [Version(1, 0, 0), Version(1, 4, 0), "1.5.0"]
    best = max_satisfying(items, Range("<1.5.0"))
    assert best is items[1]

import pytest

from semverlite.errors import InvalidVersion, SemverError
from semverlite.version import Version, compare, parse


def test_parse_components():
    v = parse("1.2.3-alpha.1+build.5")
    assert (v.major, v.minor, v.patch) == (1, 2, 3)
    assert v.prerelease == ("alpha", 1)
    assert v.build == ("build", "5")
    assert v.is_prerelease
    assert not parse("1.2.3").is_prerelease


def test_parse_strips_v_prefix_and_whitespace():
    assert str(parse("  v1.0.0  ")) == "1.0.0"
    assert str(parse("=2.3.4")) == "2.3.4"


def test_str_round_trip():
    for text in ["0.0.0", "10.20.30", "1.0.0-rc.1", "1.0.0+20130313144700", "1.0.0-beta+exp.sha.5114f85"]:
        assert str(parse(text)) == text
    assert repr(parse("1.0.0-rc.1")) == "Version('1.0.0-rc.1')"


@pytest.mark.parametrize(
    "text",
    ["1.2", "1.2.3.4", "01.2.3", "1.02.3", "1.2.03", "1.2.3-", "1.2.3-01", "1.2.3+", "1.2.3-a..b", "a.b.c", "", "1.2.3-al_pha", "-1.2.3"],
)
def test_invalid_versions(text):
    with pytest.raises(InvalidVersion):
        parse(text)


def test_error_hierarchy():
    assert issubclass(InvalidVersion, SemverError)
    assert issubclass(SemverError, ValueError)


def test_constructor_and_validation():
    v = Version(1, 2, 3, prerelease=("rc", "1"), build=("b7",))
    assert str(v) == "1.2.3-rc.1+b7"
    assert v.prerelease == ("rc", 1)
    assert str(Version(4)) == "4.0.0"
    with pytest.raises(InvalidVersion):
        Version(-1, 0, 0)
    with pytest.raises(InvalidVersion):
        Version(1, 0, 0, prerelease=("",))


def test_immutable():
    v = parse("1.2.3")
    with pytest.raises(AttributeError):
        v.major = 2


def test_spec_precedence_chain():
    chain = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1",
        "1.1.0",
        "2.0.0",
    ]
    versions = [parse(t) for t in chain]
    for lower, higher in zip(versions, versions[1:]):
        assert lower < higher
        assert higher > lower
    assert sorted(reversed(versions)) == versions


def test_numeric_parts_compare_numerically():
    assert parse("1.10.0") > parse("1.9.0")
    assert parse("1.0.0-2") < parse("1.0.0-10")
    assert parse("1.0.0-10") < parse("1.0.0-a")


def test_build_metadata_ignored_for_precedence():
    a, b = parse("1.0.0+a"), parse("1.0.0+b")
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b, parse("1.0.0")}) == 1
    assert compare("1.0.0+x", "1.0.0") == 0


def test_compare_function():
    assert compare("1.2.3", "1.2.4") == -1
    assert compare(parse("2.0.0"), "1.9.9") == 1
    assert compare("1.0.0-rc.1", "1.0.0") == -1
    with pytest.raises(InvalidVersion):
        compare("1.0", "1.0.0")


def test_equality_with_other_types():
    assert parse("1.0.0") != "1.0.0"
    with pytest.raises(TypeError):
        parse("1.0.0") < "2.0.0"


@pytest.mark.parametrize(
    "start, part, expected",
    [
        ("1.2.3", "major", "2.0.0"),
        ("1.2.3", "minor", "1.3.0"),
        ("1.2.3", "patch", "1.2.4"),
        ("1.2.3+build.1", "patch", "1.2.4"),
        ("2.0.0-rc.1", "major", "2.0.0"),
        ("2.1.0-rc.1", "major", "3.0.0"),
        ("1.3.0-beta", "minor", "1.3.0"),
        ("1.3.1-beta", "minor", "1.4.0"),
        ("1.2.4-0", "patch", "1.2.4"),
        ("1.2.3", "prerelease", "1.2.4-0"),
        ("1.2.4-alpha.1", "prerelease", "1.2.4-alpha.2"),
        ("1.2.4-alpha", "prerelease", "1.2.4-alpha.0"),
    ],
)
def test_bump(start, part, expected):
    assert str(parse(start).bump(part)) == expected


def test_bump_prerelease_with_tag():
    assert str(parse("1.2.3").bump("prerelease", tag="rc")) == "1.2.4-rc.0"
    assert str(parse("1.2.4-rc.3").bump("prerelease", tag="rc")) == "1.2.4-rc.4"
    assert str(parse("1.2.4-alpha.3").bump("prerelease", tag="beta")) == "1.2.4-beta.0"


def test_bump_returns_new_object_and_rejects_unknown_part():
    v = parse("1.2.3")
    assert v.bump("minor") is not v
    assert str(v) == "1.2.3"
    with pytest.raises(ValueError):
        v.bump("micro")

import pytest

from envfile.parser import load, parse
from envfile.writer import dump, dumps


def test_bare_values():
    assert dumps({"A": "1", "B": "some/path:with.dots@x%y+z,w-v=u", "C": ""}) == (
        "A=1\nB=some/path:with.dots@x%y+z,w-v=u\nC=\n"
    )


def test_empty_mapping():
    assert dumps({}) == ""


@pytest.mark.parametrize(
    "value, rendered",
    [
        ("hello world", "'hello world'"),
        ("a#b", "'a#b'"),
        ("${HOME}", "'${HOME}'"),
        ('say "hi"', "'say \"hi\"'"),
        ("back\\slash", "'back\\slash'"),
        ("two\nlines", "'two\nlines'"),
        ("it's", '"it\'s"'),
        ("it's $5\n\"ok\"\t\\", '"it\'s \\$5\\n\\"ok\\"\\t\\\\"'),
        ("carriage\rreturn", '"carriage\\rreturn"'),
    ],
)
def test_quoting(value, rendered):
    assert dumps({"K": value}) == f"K={rendered}\n"


def test_export_flag():
    assert dumps({"A": "1", "B": "x y"}, export=True) == "export A=1\nexport B='x y'\n"


def test_invalid_keys_and_values():
    with pytest.raises(ValueError):
        dumps({"1A": "x"})
    with pytest.raises(ValueError):
        dumps({"A-B": "x"})
    with pytest.raises(TypeError):
        dumps({"A": 1})


ROUND_TRIP = {
    "PLAIN": "value",
    "EMPTY": "",
    "SPACES": "  leading and trailing  ",
    "HASH": "a # not a comment",
    "DOLLAR": "${NOT_EXPANDED} $x",
    "SINGLE": "it's",
    "MIXED": "it's \"quoted\" ${A} \\n",
    "MULTI": "line one\nline two\n\nline four",
    "MULTI_QUOTE": "it's\nmultiline ${X}",
    "TABS": "a\tb",
    "CR": "a\rb\r\n",
    "UNICODE": "ünïcödé ✓",
    "EQUALS": "a=b",
}


def test_round_trip():
    text = dumps(ROUND_TRIP)
    assert parse(text, {"NOT_EXPANDED": "oops", "A": "oops", "X": "oops"}) == ROUND_TRIP
    assert parse(dumps(ROUND_TRIP, export=True)) == ROUND_TRIP


def test_dump_and_load(tmp_path):
    path = tmp_path / "out.env"
    dump(ROUND_TRIP, path)
    assert load(path) == ROUND_TRIP
    dump({"A": "x y"}, str(path), export=True)
    assert path.read_text(encoding="utf-8") == "export A='x y'\n"

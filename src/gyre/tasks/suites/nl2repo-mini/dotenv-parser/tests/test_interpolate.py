import pytest

from envfile.errors import EnvSyntaxError
from envfile.interpolate import expand, references


@pytest.mark.parametrize(
    "text, expected",
    [
        ("${HOST}", "example.org"),
        ("http://${HOST}:${PORT}/", "http://example.org:8080/"),
        ("${MISSING}", ""),
        ("${MISSING:-fallback}", "fallback"),
        ("${EMPTY:-fallback}", "fallback"),
        ("${EMPTY}", ""),
        ("${HOST:-fallback}", "example.org"),
        ("${MISSING:-}", ""),
        ("${MISSING:-a b:c-d}", "a b:c-d"),
        ("${MISSING:-$HOST}", "$HOST"),
        ("$HOST and $ alone", "$HOST and $ alone"),
        ("no refs", "no refs"),
        ("", ""),
        ("{HOST}", "{HOST}"),
        ("$${HOST}", "$example.org"),
    ],
)
def test_expand(text, expected):
    variables = {"HOST": "example.org", "PORT": "8080", "EMPTY": ""}
    assert expand(text, variables) == expected


def test_expand_is_single_pass():
    # substituted values are not expanded again
    assert expand("${A}", {"A": "${B}", "B": "x"}) == "${B}"


@pytest.mark.parametrize("text", ["${HOST", "abc ${", "${}", "${1ABC}", "${A-B}", "${A B}", "${A:b}"])
def test_expand_errors(text):
    with pytest.raises(EnvSyntaxError) as info:
        expand(text, {})
    assert info.value.lineno is None


def test_references():
    assert references("${A} ${B:-x} ${A} $C") == ["A", "B"]
    assert references("plain") == []
    with pytest.raises(EnvSyntaxError):
        references("${oops")


def test_error_formatting():
    e = EnvSyntaxError("bad thing", 7)
    assert isinstance(e, ValueError)
    assert e.msg == "bad thing"
    assert e.lineno == 7
    assert str(e) == "line 7: bad thing"
    assert str(EnvSyntaxError("bad thing")) == "bad thing"

import pytest

from envfile.errors import EnvSyntaxError
from envfile.parser import load, parse


def test_basic_pairs_comments_and_blank_lines():
    text = "# a comment\n\nA=1\n   # indented comment\nB = two\n  C=three  \n"
    assert parse(text) == {"A": "1", "B": "two", "C": "three"}


def test_order_and_duplicates():
    result = parse("B=1\nA=2\nB=3\n")
    assert result == {"B": "3", "A": "2"}
    assert list(result) == ["B", "A"]


def test_export_prefix():
    assert parse("export A=1\nexport\tB='x'\n") == {"A": "1", "B": "x"}
    assert parse("export=1\n") == {"export": "1"}


def test_empty_values():
    assert parse("A=\nB=''\nC=\"\"\nD= # only a comment\n") == {"A": "", "B": "", "C": "", "D": ""}


@pytest.mark.parametrize(
    "line, expected",
    [
        ("A=value # comment", "value"),
        ("A=value\t# comment", "value"),
        ("A=value#not-a-comment", "value#not-a-comment"),
        ("A=#hash", "#hash"),
        ("A=a=b=c", "a=b=c"),
        ("A=it's", "it's"),
        ('A=say "hi"', 'say "hi"'),
        ("A=back\\slash\\n", "back\\slash\\n"),
        ("A=  spaced out  ", "spaced out"),
    ],
)
def test_unquoted_values(line, expected):
    assert parse(line) == {"A": expected}


@pytest.mark.parametrize(
    "line, expected",
    [
        ("A='single ${X} \\n # kept'", "single ${X} \\n # kept"),
        ("A='  padded  '", "  padded  "),
        ("A='value' # trailing comment", "value"),
        ("A='value'# trailing comment", "value"),
        ('A="tab\\there"', "tab\there"),
        ('A="line1\\nline2"', "line1\nline2"),
        ('A="cr\\r"', "cr\r"),
        ('A="quote \\" inside"', 'quote " inside'),
        ('A="back\\\\slash"', "back\\slash"),
        ('A="dollar \\${X}"', "dollar ${X}"),
        ('A="unknown \\q escape"', "unknown \\q escape"),
        ('A="hash # inside"', "hash # inside"),
        ('A="it\'s"', "it's"),
        ('A="x" # comment', "x"),
    ],
)
def test_quoted_values(line, expected):
    assert parse(line, {"X": "ex"}) == {"A": expected}


def test_multiline_values():
    text = 'A="first\nsecond"\nB=\'one  \n  two\n\'\nC=3\n'
    assert parse(text) == {"A": "first\nsecond", "B": "one  \n  two\n", "C": "3"}


def test_crlf_line_endings():
    assert parse("A=1\r\nB='x\r\ny'\r\n") == {"A": "1", "B": "x\ny"}


def test_interpolation_from_earlier_keys_and_environ():
    text = (
        "HOST=localhost\n"
        "URL=http://${HOST}:${PORT:-5432}/db\n"
        'GREETING="hello ${USER}"\n'
        "LITERAL='${HOST}'\n"
        "LATER=${DEFINED_BELOW}\n"
        "DEFINED_BELOW=x\n"
        "HOME_DIR=${HOME:-/root}\n"
    )
    result = parse(text, {"USER": "ada", "HOME": "/home/ada", "DEFINED_BELOW": "from-env"})
    assert result == {
        "HOST": "localhost",
        "URL": "http://localhost:5432/db",
        "GREETING": "hello ada",
        "LITERAL": "${HOST}",
        "LATER": "from-env",
        "DEFINED_BELOW": "x",
        "HOME_DIR": "/home/ada",
    }


def test_earlier_keys_override_environ():
    assert parse("A=file\nB=${A}\n", {"A": "env"}) == {"A": "file", "B": "file"}
    assert parse("PATH=${PATH}:/opt/bin\n", {"PATH": "/usr/bin"}) == {"PATH": "/usr/bin:/opt/bin"}
    assert parse("E=\nF=${E:-dflt}\n", {"E": "env"}) == {"E": "", "F": "dflt"}


def test_environ_not_in_result_and_default_environ_is_empty():
    assert parse("A=${B}\n", {"B": "1", "C": "2"}) == {"A": "1"}
    assert parse("A=${HOME}\n") == {"A": ""}


def test_interpolate_false():
    text = 'A=1\nB=${A}\nC="${A}\\n"\n'
    assert parse(text, interpolate=False) == {"A": "1", "B": "${A}", "C": "${A}\n"}


@pytest.mark.parametrize(
    "text, lineno",
    [
        ("NOEQUALS\n", 1),
        ("A=1\n\n1BAD=x\n", 3),
        ("A-B=1\n", 1),
        ("A=1\n='x'\n", 2),
        ("A=1\nB='never closed\nC=2\n", 2),
        ('A="never closed\nC=2\n', 1),
        ('# c\nA="x" junk\n', 2),
        ("A='x'y\n", 1),
        ("A=1\nB=${A\n", 2),
        ('A=1\nB=2\nC="${9X}"\n', 3),
        ("export FOO\n", 1),
    ],
)
def test_syntax_errors_have_line_numbers(text, lineno):
    with pytest.raises(EnvSyntaxError) as info:
        parse(text)
    assert info.value.lineno == lineno
    assert str(info.value).startswith(f"line {lineno}: ")


def test_load(tmp_path):
    path = tmp_path / ".env"
    path.write_bytes(b"# settings\nexport NAME='caf\xc3\xa9'\nGREETING=\"hi ${NAME}\"\r\n")
    assert load(path) == {"NAME": "café", "GREETING": "hi café"}
    assert load(str(path), interpolate=False)["GREETING"] == "hi ${NAME}"
    assert load(path, {"X": "1"}) == {"NAME": "café", "GREETING": "hi café"}

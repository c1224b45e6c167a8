import pytest

from jsonpatchlite.pointer import (
    JsonPointerError,
    format_pointer,
    parse_pointer,
    remove,
    resolve,
    set_value,
)

RFC_DOC = {
    "foo": ["bar", "baz"],
    "": 0,
    "a/b": 1,
    "c%d": 2,
    "e^f": 3,
    "g|h": 4,
    "i\\j": 5,
    'k"l': 6,
    " ": 7,
    "m~n": 8,
}


@pytest.mark.parametrize(
    "pointer, tokens",
    [
        ("", []),
        ("/", [""]),
        ("/foo/0", ["foo", "0"]),
        ("/a~1b", ["a/b"]),
        ("/m~0n", ["m~n"]),
        ("/~01", ["~1"]),
        ("/a//b", ["a", "", "b"]),
    ],
)
def test_parse_pointer(pointer, tokens):
    assert parse_pointer(pointer) == tokens


@pytest.mark.parametrize("pointer", ["foo", "/a~2b", "/a~", "#/foo"])
def test_parse_pointer_rejects_malformed(pointer):
    with pytest.raises(JsonPointerError):
        parse_pointer(pointer)


def test_pointer_error_is_value_error():
    assert issubclass(JsonPointerError, ValueError)


def test_format_pointer_escapes_and_accepts_ints():
    assert format_pointer(["a/b", "m~n", 0]) == "/a~1b/m~0n/0"
    assert format_pointer([]) == ""
    assert format_pointer(["~1"]) == "/~01"
    assert parse_pointer(format_pointer(["x/~y", ""])) == ["x/~y", ""]


@pytest.mark.parametrize(
    "pointer, expected",
    [
        ("", RFC_DOC),
        ("/foo", ["bar", "baz"]),
        ("/foo/0", "bar"),
        ("/", 0),
        ("/a~1b", 1),
        ("/c%d", 2),
        ("/e^f", 3),
        ("/g|h", 4),
        ("/i\\j", 5),
        ('/k"l', 6),
        ("/ ", 7),
        ("/m~0n", 8),
    ],
)
def test_resolve_rfc_examples(pointer, expected):
    assert resolve(RFC_DOC, pointer) == expected


@pytest.mark.parametrize(
    "pointer",
    ["/missing", "/foo/2", "/foo/-", "/foo/01", "/foo/-1", "/foo/x", "/foo/0/bar", "/ /x"],
)
def test_resolve_errors(pointer):
    with pytest.raises(JsonPointerError):
        resolve(RFC_DOC, pointer)


def test_resolve_default_is_returned_for_missing_paths():
    assert resolve(RFC_DOC, "/missing", None) is None
    assert resolve(RFC_DOC, "/foo/9", default="d") == "d"
    assert resolve(RFC_DOC, "/foo/1", default="d") == "baz"


def test_resolve_default_does_not_hide_malformed_pointer():
    with pytest.raises(JsonPointerError):
        resolve(RFC_DOC, "no-slash", default=None)


def test_set_value_mutates_in_place_and_returns_document():
    doc = {"a": {"b": 1}, "l": [1, 2, 3]}
    result = set_value(doc, "/a/c", 2)
    assert result is doc
    assert doc["a"] == {"b": 1, "c": 2}
    set_value(doc, "/a/b", 10)
    assert doc["a"]["b"] == 10


def test_set_value_on_lists():
    doc = {"l": [1, 2, 3]}
    set_value(doc, "/l/1", 20)
    assert doc["l"] == [1, 20, 3]
    set_value(doc, "/l/-", 4)
    assert doc["l"] == [1, 20, 3, 4]
    set_value(doc, "/l/4", 5)
    assert doc["l"] == [1, 20, 3, 4, 5]
    set_value(doc, "/l/0", 0, insert=True)
    assert doc["l"] == [0, 1, 20, 3, 4, 5]


def test_set_value_errors():
    doc = {"l": [1, 2], "s": "text"}
    with pytest.raises(JsonPointerError):
        set_value(doc, "/l/3", 9)
    with pytest.raises(JsonPointerError):
        set_value(doc, "/missing/x", 9)
    with pytest.raises(JsonPointerError):
        set_value(doc, "/s/x", 9)
    with pytest.raises(JsonPointerError):
        set_value(doc, "/l/01", 9)
    assert doc == {"l": [1, 2], "s": "text"}


def test_set_value_root_returns_new_value():
    doc = {"a": 1}
    assert set_value(doc, "", [1, 2]) == [1, 2]
    assert doc == {"a": 1}


def test_remove_returns_removed_value():
    doc = {"a": {"b": 1, "c": 2}, "l": ["x", "y", "z"]}
    assert remove(doc, "/a/b") == 1
    assert doc["a"] == {"c": 2}
    assert remove(doc, "/l/0") == "x"
    assert doc["l"] == ["y", "z"]


@pytest.mark.parametrize("pointer", ["", "/nope", "/l/2", "/l/-", "/a/b/c"])
def test_remove_errors(pointer):
    doc = {"a": {"b": 1}, "l": [1, 2]}
    with pytest.raises(JsonPointerError):
        remove(doc, pointer)
    assert doc == {"a": {"b": 1}, "l": [1, 2]}

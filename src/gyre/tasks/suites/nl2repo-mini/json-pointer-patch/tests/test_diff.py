import copy

import pytest

from jsonpatchlite.diff import make_patch
from jsonpatchlite.patch import apply_patch


def test_identical_documents_give_empty_patch():
    doc = {"a": [1, {"b": None}], "c": "x"}
    assert make_patch(doc, copy.deepcopy(doc)) == []


def test_int_and_float_with_same_value_are_equal():
    assert make_patch({"a": 1}, {"a": 1.0}) == []


def test_bool_and_int_are_different():
    assert make_patch({"a": 1}, {"a": True}) == [{"op": "replace", "path": "/a", "value": True}]


def test_object_diff_order():
    a = {"x": 1, "gone": 2, "b": 2, "keep": 0}
    b = {"new1": 9, "x": 1, "b": 3, "keep": 0, "new2": [1]}
    assert make_patch(a, b) == [
        {"op": "remove", "path": "/gone"},
        {"op": "replace", "path": "/b", "value": 3},
        {"op": "add", "path": "/new1", "value": 9},
        {"op": "add", "path": "/new2", "value": [1]},
    ]


def test_nested_object_diff_recurses():
    a = {"user": {"name": "ann", "tags": ["a"]}}
    b = {"user": {"name": "bob", "tags": ["a"]}}
    assert make_patch(a, b) == [{"op": "replace", "path": "/user/name", "value": "bob"}]


def test_list_growth():
    assert make_patch([1, 2], [1, 3, 4, 5]) == [
        {"op": "replace", "path": "/1", "value": 3},
        {"op": "add", "path": "/2", "value": 4},
        {"op": "add", "path": "/3", "value": 5},
    ]


def test_list_shrink_removes_from_the_end():
    assert make_patch({"l": [1, 2, 3, 4]}, {"l": [1]}) == [
        {"op": "remove", "path": "/l/3"},
        {"op": "remove", "path": "/l/2"},
        {"op": "remove", "path": "/l/1"},
    ]


def test_list_items_are_diffed_recursively():
    a = [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}]
    b = [{"id": 1, "v": "a"}, {"id": 2, "v": "c"}]
    assert make_patch(a, b) == [{"op": "replace", "path": "/1/v", "value": "c"}]


@pytest.mark.parametrize(
    "a, b",
    [
        ({"a": 1}, [1]),
        ([1], {"0": 1}),
        ("x", 3),
        ({"a": 1}, None),
    ],
)
def test_type_change_at_root_is_replace(a, b):
    assert make_patch(a, b) == [{"op": "replace", "path": "", "value": b}]


def test_type_change_below_root():
    assert make_patch({"a": {"b": 1}}, {"a": [1]}) == [
        {"op": "replace", "path": "/a", "value": [1]}
    ]


def test_keys_are_escaped():
    assert make_patch({"a/b": 1, "m~n": 1}, {"a/b": 2}) == [
        {"op": "replace", "path": "/a~1b", "value": 2},
        {"op": "remove", "path": "/m~0n"},
    ]


def test_patch_values_are_copies():
    b = {"a": {"list": [1]}}
    patch = make_patch({}, b)
    b["a"]["list"].append(2)
    assert patch == [{"op": "add", "path": "/a", "value": {"list": [1]}}]


@pytest.mark.parametrize(
    "a, b",
    [
        ({}, {"a": {"b": [1, 2, {"c": None}]}}),
        ({"a": [1, 2, 3]}, {"a": [3, 2, 1, 0]}),
        ([0, [1, [2, [3]]]], [0, [1, [2, [4, 5]]], 6]),
        ({"x": {"y": {"z": 1}}, "w": True}, {"x": {"y": {}}, "w": False}),
        ({"a/b": {"~": 1}}, {"a/b": {"~": 2, "~1": 3}}),
        ([{"k": 1}, {"k": 2}, {"k": 3}], [{"k": 2}]),
        ({"n": None}, {"n": 0}),
    ],
)
def test_round_trip(a, b):
    original = copy.deepcopy(a)
    patch = make_patch(a, b)
    assert apply_patch(a, patch) == b
    assert a == original

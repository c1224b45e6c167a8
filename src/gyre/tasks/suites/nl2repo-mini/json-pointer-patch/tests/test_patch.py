import copy

import pytest

from jsonpatchlite.patch import JsonPatchError, JsonPatchTestFailed, apply_patch


def test_add_member_to_object():
    doc = {"foo": "bar"}
    assert apply_patch(doc, [{"op": "add", "path": "/baz", "value": "qux"}]) == {
        "foo": "bar",
        "baz": "qux",
    }


def test_add_inserts_into_array():
    doc = {"foo": ["bar", "baz"]}
    result = apply_patch(doc, [{"op": "add", "path": "/foo/1", "value": "qux"}])
    assert result == {"foo": ["bar", "qux", "baz"]}


def test_add_appends_with_dash_and_length_index():
    doc = [1, 2]
    result = apply_patch(
        doc,
        [{"op": "add", "path": "/-", "value": 3}, {"op": "add", "path": "/3", "value": 4}],
    )
    assert result == [1, 2, 3, 4]


def test_add_replaces_existing_member():
    assert apply_patch({"a": 1}, [{"op": "add", "path": "/a", "value": [2]}]) == {"a": [2]}


def test_add_null_value_is_allowed():
    assert apply_patch({}, [{"op": "add", "path": "/a", "value": None}]) == {"a": None}


def test_add_at_root_replaces_document():
    assert apply_patch({"a": 1}, [{"op": "add", "path": "", "value": [1]}]) == [1]


@pytest.mark.parametrize("path", ["/missing/child", "/l/5", "/l/01"])
def test_add_errors(path):
    with pytest.raises(JsonPatchError):
        apply_patch({"l": [1]}, [{"op": "add", "path": path, "value": 0}])


def test_remove():
    doc = {"baz": "qux", "foo": "bar", "l": [1, 2, 3]}
    result = apply_patch(
        doc, [{"op": "remove", "path": "/baz"}, {"op": "remove", "path": "/l/1"}]
    )
    assert result == {"foo": "bar", "l": [1, 3]}


def test_remove_missing_is_error():
    with pytest.raises(JsonPatchError):
        apply_patch({"a": 1}, [{"op": "remove", "path": "/b"}])


def test_replace():
    doc = {"baz": "qux", "l": [1, 2]}
    result = apply_patch(
        doc,
        [
            {"op": "replace", "path": "/baz", "value": "boo"},
            {"op": "replace", "path": "/l/0", "value": 9},
        ],
    )
    assert result == {"baz": "boo", "l": [9, 2]}


def test_replace_root():
    assert apply_patch({"a": 1}, [{"op": "replace", "path": "", "value": 5}]) == 5


@pytest.mark.parametrize("path", ["/missing", "/l/2", "/l/-"])
def test_replace_missing_target_is_error(path):
    with pytest.raises(JsonPatchError):
        apply_patch({"l": [1, 2]}, [{"op": "replace", "path": path, "value": 0}])


def test_move_between_objects_and_within_array():
    doc = {"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}, "l": [1, 2, 3, 4]}
    result = apply_patch(
        doc,
        [
            {"op": "move", "from": "/foo/waldo", "path": "/qux/thud"},
            {"op": "move", "from": "/l/1", "path": "/l/3"},
        ],
    )
    assert result == {
        "foo": {"bar": "baz"},
        "qux": {"corge": "grault", "thud": "fred"},
        "l": [1, 3, 4, 2],
    }


def test_move_into_own_child_is_error():
    with pytest.raises(JsonPatchError):
        apply_patch({"a": {"b": {}}}, [{"op": "move", "from": "/a", "path": "/a/b/c"}])


def test_move_to_same_path_is_noop():
    doc = {"a": {"b": 1}}
    assert apply_patch(doc, [{"op": "move", "from": "/a", "path": "/a"}]) == doc


def test_move_to_sibling_with_common_prefix_is_allowed():
    result = apply_patch({"a": 1}, [{"op": "move", "from": "/a", "path": "/ab"}])
    assert result == {"ab": 1}


def test_move_missing_source_is_error():
    with pytest.raises(JsonPatchError):
        apply_patch({"a": 1}, [{"op": "move", "from": "/x", "path": "/y"}])


def test_copy_is_deep():
    doc = {"a": {"list": [1]}}
    result = apply_patch(
        doc,
        [
            {"op": "copy", "from": "/a", "path": "/b"},
            {"op": "add", "path": "/b/list/-", "value": 2},
        ],
    )
    assert result == {"a": {"list": [1]}, "b": {"list": [1, 2]}}


def test_copy_into_array_inserts():
    result = apply_patch([1, 2], [{"op": "copy", "from": "/1", "path": "/0"}])
    assert result == [2, 1, 2]


def test_test_operation_success():
    doc = {"baz": "qux", "foo": ["a", 2, "c"], "n": None, "f": 1.0}
    patch = [
        {"op": "test", "path": "/baz", "value": "qux"},
        {"op": "test", "path": "/foo/1", "value": 2},
        {"op": "test", "path": "/n", "value": None},
        {"op": "test", "path": "/f", "value": 1},
        {"op": "test", "path": "", "value": copy.deepcopy(doc)},
    ]
    assert apply_patch(doc, patch) == doc


def test_test_operation_failure_reports_index():
    patch = [
        {"op": "add", "path": "/b", "value": 2},
        {"op": "test", "path": "/a", "value": "x"},
    ]
    with pytest.raises(JsonPatchTestFailed) as info:
        apply_patch({"a": 1}, patch)
    assert isinstance(info.value, JsonPatchError)
    assert info.value.index == 1


@pytest.mark.parametrize(
    "actual, expected",
    [(True, 1), (1, True), (0, False), (None, False), ("1", 1), ([1], (1,)), ({"a": True}, {"a": 1})],
)
def test_test_operation_is_type_strict(actual, expected):
    with pytest.raises(JsonPatchTestFailed):
        apply_patch({"v": actual}, [{"op": "test", "path": "/v", "value": expected}])


def test_test_on_missing_path_is_patch_error():
    with pytest.raises(JsonPatchError):
        apply_patch({}, [{"op": "test", "path": "/a", "value": None}])


def test_failed_patch_leaves_original_untouched():
    doc = {"a": [1, 2], "b": {"c": 1}}
    snapshot = copy.deepcopy(doc)
    patch = [
        {"op": "add", "path": "/a/-", "value": 3},
        {"op": "remove", "path": "/b/c"},
        {"op": "remove", "path": "/does-not-exist"},
    ]
    with pytest.raises(JsonPatchError) as info:
        apply_patch(doc, patch)
    assert info.value.index == 2
    assert doc == snapshot


def test_successful_patch_does_not_mutate_input():
    doc = {"a": [1, 2]}
    result = apply_patch(doc, [{"op": "add", "path": "/a/0", "value": 0}])
    assert result == {"a": [0, 1, 2]}
    assert doc == {"a": [1, 2]}


def test_added_values_are_copied_from_patch():
    value = {"x": [1]}
    patch = [{"op": "add", "path": "/v", "value": value}]
    result = apply_patch({}, patch)
    result["v"]["x"].append(2)
    assert value == {"x": [1]}


@pytest.mark.parametrize(
    "patch",
    [
        {"op": "add", "path": "/a", "value": 1},
        [{"op": "frobnicate", "path": "/a"}],
        [{"path": "/a", "value": 1}],
        [{"op": "add", "path": "/a"}],
        [{"op": "replace", "path": "/a"}],
        [{"op": "test", "path": "/a"}],
        [{"op": "move", "path": "/a"}],
        [{"op": "copy", "path": "/a"}],
        [{"op": "remove"}],
        ["not an object"],
    ],
)
def test_malformed_patches(patch):
    with pytest.raises(JsonPatchError):
        apply_patch({"a": 1}, patch)


def test_malformed_operation_reports_index():
    patch = [{"op": "add", "path": "/b", "value": 1}, {"op": "add", "path": "/c"}]
    with pytest.raises(JsonPatchError) as info:
        apply_patch({}, patch)
    assert info.value.index == 1


def test_patch_error_is_value_error():
    assert issubclass(JsonPatchError, ValueError)
    assert issubclass(JsonPatchTestFailed, JsonPatchError)


def test_empty_patch_returns_equal_copy():
    doc = {"a": [1, {"b": 2}]}
    result = apply_patch(doc, [])
    assert result == doc
    assert result is not doc
    assert result["a"] is not doc["a"]

"""RFC 6902 JSON patch."""

import copy

from .pointer import JsonPointerError, parse_pointer, remove, resolve, set_value


class JsonPatchError(ValueError):
    """Raised when a patch is malformed or cannot be applied."""

    def __init__(self, message, index=None):
        super().__init__(message)
        self.index = index


class JsonPatchTestFailed(JsonPatchError):
    """Raised when a ``test`` operation does not match."""


_REQUIRED = {
    "add": ("value",),
    "remove": (),
    "replace": ("value",),
    "move": ("from",),
    "copy": ("from",),
    "test": ("value",),
}


def json_equal(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if type(a) is not type(b):
        return False
    return a == b


def _apply_one(doc, op, index):
    if not isinstance(op, dict):
        raise JsonPatchError(f"operation {index} is not an object", index)
    name = op.get("op")
    if name not in _REQUIRED:
        raise JsonPatchError(f"operation {index}: unknown op {name!r}", index)
    if "path" not in op or not isinstance(op["path"], str):
        raise JsonPatchError(f"operation {index}: missing 'path'", index)
    for member in _REQUIRED[name]:
        if member not in op:
            raise JsonPatchError(f"operation {index}: missing {member!r}", index)
    path = op["path"]
    if name == "add":
        return set_value(doc, path, copy.deepcopy(op["value"]), insert=True)
    if name == "remove":
        remove(doc, path)
        return doc
    if name == "replace":
        resolve(doc, path)
        return set_value(doc, path, copy.deepcopy(op["value"]), insert=False)
    if name == "test":
        actual = resolve(doc, path)
        if not json_equal(actual, op["value"]):
            raise JsonPatchTestFailed(f"operation {index}: test failed at {path!r}", index)
        return doc
    source = op["from"]
    if not isinstance(source, str):
        raise JsonPatchError(f"operation {index}: 'from' must be a string", index)
    if name == "copy":
        value = copy.deepcopy(resolve(doc, source))
        return set_value(doc, path, value, insert=True)
    # move
    src_tokens = parse_pointer(source)
    dst_tokens = parse_pointer(path)
    if src_tokens == dst_tokens:
        resolve(doc, source)
        return doc
    if dst_tokens[: len(src_tokens)] == src_tokens:
        raise JsonPatchError(f"operation {index}: cannot move {source!r} into itself", index)
    value = remove(doc, source)
    return set_value(doc, path, value, insert=True)


def apply_patch(doc, patch):
    if not isinstance(patch, list):
        raise JsonPatchError("patch must be a list of operations")
    result = copy.deepcopy(doc)
    for index, op in enumerate(patch):
        try:
            result = _apply_one(result, op, index)
        except JsonPointerError as exc:
            raise JsonPatchError(f"operation {index}: {exc}", index) from exc
    return result

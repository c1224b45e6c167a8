"""RFC 6902 JSON patch (work in progress)."""

import copy

from .pointer import JsonPointerError, remove, resolve, set_value


class JsonPatchError(ValueError):
    def __init__(self, message, index=None):
        super().__init__(message)
        self.index = index


class JsonPatchTestFailed(JsonPatchError):
    pass


def json_equal(a, b):
    return a == b


def apply_patch(doc, patch):
    result = copy.deepcopy(doc)
    for op in patch:
        name = op["op"]
        path = op["path"]
        try:
            if name == "add":
                result = set_value(result, path, op["value"], insert=True)
            elif name == "remove":
                remove(result, path)
            elif name == "replace":
                resolve(result, path)
                result = set_value(result, path, op["value"])
            elif name == "test":
                if not json_equal(resolve(result, path), op["value"]):
                    raise JsonPatchTestFailed(f"test failed at {path}")
            else:
                # TODO: move and copy
                raise NotImplementedError(name)
        except JsonPointerError as exc:
            raise JsonPatchError(str(exc)) from exc
    return result

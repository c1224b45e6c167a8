"""Generate JSON patches that turn one document into another."""

import copy

from .patch import json_equal
from .pointer import escape_token


def _diff(a, b, path, ops):
    if json_equal(a, b):
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a:
            child = path + "/" + escape_token(key)
            if key not in b:
                ops.append({"op": "remove", "path": child})
            else:
                _diff(a[key], b[key], child, ops)
        for key in b:
            if key not in a:
                ops.append({"op": "add", "path": path + "/" + escape_token(key),
                            "value": copy.deepcopy(b[key])})
        return
    if isinstance(a, list) and isinstance(b, list):
        common = min(len(a), len(b))
        for i in range(common):
            _diff(a[i], b[i], f"{path}/{i}", ops)
        for i in range(common, len(b)):
            ops.append({"op": "add", "path": f"{path}/{i}", "value": copy.deepcopy(b[i])})
        for i in range(len(a) - 1, common - 1, -1):
            ops.append({"op": "remove", "path": f"{path}/{i}"})
        return
    ops.append({"op": "replace", "path": path, "value": copy.deepcopy(b)})


def make_patch(a, b):
    ops = []
    _diff(a, b, "", ops)
    return ops

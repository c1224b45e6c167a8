"""jsonpatchlite: JSON pointers (RFC 6901) and JSON patch (RFC 6902)."""

from .diff import make_patch
from .patch import JsonPatchError, JsonPatchTestFailed, apply_patch, json_equal
from .pointer import (
    JsonPointerError,
    escape_token,
    format_pointer,
    parse_pointer,
    remove,
    resolve,
    set_value,
    unescape_token,
)

__all__ = [
    "JsonPatchError",
    "JsonPatchTestFailed",
    "JsonPointerError",
    "apply_patch",
    "escape_token",
    "format_pointer",
    "json_equal",
    "make_patch",
    "parse_pointer",
    "remove",
    "resolve",
    "set_value",
    "unescape_token",
]

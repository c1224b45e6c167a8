"""RFC 6901 JSON pointers."""

_MISSING = object()


class JsonPointerError(ValueError):
    """Raised for malformed pointers and pointers that cannot be applied."""


def escape_token(token):
    return str(token).replace("~", "~0").replace("/", "~1")


def unescape_token(token):
    out = []
    i = 0
    while i < len(token):
        ch = token[i]
        if ch == "~":
            nxt = token[i + 1] if i + 1 < len(token) else ""
            if nxt == "0":
                out.append("~")
            elif nxt == "1":
                out.append("/")
            else:
                raise JsonPointerError(f"invalid escape in token {token!r}")
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def parse_pointer(pointer):
    if not isinstance(pointer, str):
        raise JsonPointerError(f"pointer must be a string, got {type(pointer).__name__}")
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise JsonPointerError(f"pointer must start with '/': {pointer!r}")
    return [unescape_token(tok) for tok in pointer[1:].split("/")]


def format_pointer(tokens):
    return "".join("/" + escape_token(tok) for tok in tokens)


def _is_container(value):
    return isinstance(value, (dict, list))


def _list_index(lst, token, *, allow_end):
    """Convert token to an index of lst. allow_end permits len(lst) and '-'."""
    if token == "-":
        if allow_end:
            return len(lst)
        raise JsonPointerError("'-' refers to a nonexistent array element")
    if not token.isdigit() or not token.isascii() or (len(token) > 1 and token[0] == "0"):
        raise JsonPointerError(f"invalid array index {token!r}")
    index = int(token)
    limit = len(lst) if allow_end else len(lst) - 1
    if index > limit:
        raise JsonPointerError(f"array index {index} out of range")
    return index


def _step(container, token):
    if isinstance(container, dict):
        if token not in container:
            raise JsonPointerError(f"key {token!r} not found")
        return container[token]
    if isinstance(container, list):
        return container[_list_index(container, token, allow_end=False)]
    raise JsonPointerError(f"cannot index into {type(container).__name__} with {token!r}")


def _walk(doc, tokens):
    current = doc
    for tok in tokens:
        current = _step(current, tok)
    return current


def resolve(doc, pointer, default=_MISSING):
    tokens = parse_pointer(pointer)
    try:
        return _walk(doc, tokens)
    except JsonPointerError:
        if default is _MISSING:
            raise
        return default


def set_value(doc, pointer, value, *, insert=False):
    tokens = parse_pointer(pointer)
    if not tokens:
        return value
    parent = _walk(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        index = _list_index(parent, last, allow_end=True)
        if insert or index == len(parent):
            parent.insert(index, value)
        else:
            parent[index] = value
    else:
        raise JsonPointerError(f"cannot set a member of {type(parent).__name__}")
    return doc


def remove(doc, pointer):
    tokens = parse_pointer(pointer)
    if not tokens:
        raise JsonPointerError("cannot remove the document root")
    parent = _walk(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise JsonPointerError(f"key {last!r} not found")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_list_index(parent, last, allow_end=False))
    raise JsonPointerError(f"cannot remove a member of {type(parent).__name__}")

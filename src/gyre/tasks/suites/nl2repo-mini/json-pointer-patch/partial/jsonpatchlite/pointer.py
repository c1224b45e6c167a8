"""RFC 6901 JSON pointers."""

_MISSING = object()


class JsonPointerError(ValueError):
    pass


def escape_token(token):
    return str(token).replace("~", "~0").replace("/", "~1")


def unescape_token(token):
    # TODO: validate escapes
    return token.replace("~0", "~").replace("~1", "/")


def parse_pointer(pointer):
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise JsonPointerError(f"pointer must start with '/': {pointer!r}")
    return [unescape_token(tok) for tok in pointer[1:].split("/")]


def format_pointer(tokens):
    return "".join("/" + escape_token(tok) for tok in tokens)


def _index(lst, token, allow_end):
    if token == "-":
        if allow_end:
            return len(lst)
        raise JsonPointerError("'-' not allowed here")
    try:
        index = int(token)
    except ValueError:
        raise JsonPointerError(f"bad index {token!r}") from None
    if index < 0 or index > (len(lst) if allow_end else len(lst) - 1):
        raise JsonPointerError("index out of range")
    return index


def _walk(doc, tokens):
    cur = doc
    for tok in tokens:
        if isinstance(cur, dict):
            if tok not in cur:
                raise JsonPointerError(f"missing key {tok!r}")
            cur = cur[tok]
        elif isinstance(cur, list):
            cur = cur[_index(cur, tok, False)]
        else:
            raise JsonPointerError("cannot index scalar")
    return cur


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
    if isinstance(parent, dict):
        parent[tokens[-1]] = value
    elif isinstance(parent, list):
        i = _index(parent, tokens[-1], True)
        if insert or i == len(parent):
            parent.insert(i, value)
        else:
            parent[i] = value
    else:
        raise JsonPointerError("cannot set on scalar")
    return doc


def remove(doc, pointer):
    tokens = parse_pointer(pointer)
    if not tokens:
        raise JsonPointerError("cannot remove root")
    parent = _walk(doc, tokens[:-1])
    if isinstance(parent, dict):
        if tokens[-1] not in parent:
            raise JsonPointerError("missing key")
        return parent.pop(tokens[-1])
    if isinstance(parent, list):
        return parent.pop(_index(parent, tokens[-1], False))
    raise JsonPointerError("cannot remove from scalar")

"""Integers to English words (US style, no "and"), ordinals, and back."""

from .errors import OutOfRangeError, WordsParseError

MAX_VALUE = 10**15 - 1

_ONES = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
    "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen",
    "sixteen", "seventeen", "eighteen", "nineteen",
]
_TENS = {
    20: "twenty", 30: "thirty", 40: "forty", 50: "fifty",
    60: "sixty", 70: "seventy", 80: "eighty", 90: "ninety",
}
_SCALES = [
    (10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (10**3, "thousand"),
]
# TODO: eight/nine/twelve
_IRREGULAR_ORDINALS = {"one": "first", "two": "second", "three": "third", "five": "fifth"}

_WORD_VALUES = {word: value for value, word in enumerate(_ONES)}
_WORD_VALUES.update({word: value for value, word in _TENS.items()})
_SCALE_VALUES = {word: value for value, word in _SCALES}


def _below_thousand(n):
    parts = []
    hundreds, rest = divmod(n, 100)
    if hundreds:
        parts.append(f"{_ONES[hundreds]} hundred")
    if rest:
        if rest < 20:
            parts.append(_ONES[rest])
        else:
            tens, units = divmod(rest, 10)
            word = _TENS[tens * 10]
            parts.append(f"{word}-{_ONES[units]}" if units else word)
    return " ".join(parts)


def to_words(n):
    if not isinstance(n, int):
        raise TypeError("expected an int")
    if abs(n) > MAX_VALUE:
        raise OutOfRangeError(f"{n} is outside the supported range")
    if n == 0:
        return "zero"
    if n < 0:
        return "minus " + to_words(-n)
    parts = []
    rest = n
    for value, name in _SCALES:
        count, rest = divmod(rest, value)
        if count:
            parts.append(f"{_below_thousand(count)} {name}")
    if rest:
        parts.append(_below_thousand(rest))
    return " ".join(parts)


def to_ordinal(n):
    if n < 0:
        raise OutOfRangeError("negative")
    words = to_words(n)
    head, sep, last = words.rpartition(" ")
    prefix, hyphen, unit = last.rpartition("-")
    if unit in _IRREGULAR_ORDINALS:
        unit = _IRREGULAR_ORDINALS[unit]
    elif unit.endswith("y"):
        unit = unit[:-1] + "ieth"
    else:
        unit += "th"
    return head + sep + prefix + hyphen + unit


def ordinal_suffix(n):
    n = abs(n)
    if 11 <= n % 100 <= 13:
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def to_ordinal_numeral(n):
    return f"{n}{ordinal_suffix(n)}"


def from_words(text):
    # FIXME: no grammar checks yet, just accumulate
    tokens = text.lower().replace("-", " ").split()
    if not tokens:
        raise WordsParseError("empty input")
    negative = tokens[0] == "minus"
    if negative:
        tokens = tokens[1:]
    total = 0
    group = 0
    for token in tokens:
        if token in _SCALE_VALUES:
            total += group * _SCALE_VALUES[token]
            group = 0
        elif token == "hundred":
            group *= 100
        elif token in _WORD_VALUES:
            group += _WORD_VALUES[token]
        else:
            raise WordsParseError(f"unknown word {token!r}")
    total += group
    return -total if negative else total

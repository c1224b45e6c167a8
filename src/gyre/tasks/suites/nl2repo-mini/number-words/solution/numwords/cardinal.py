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
_IRREGULAR_ORDINALS = {
    "one": "first", "two": "second", "three": "third", "five": "fifth",
    "eight": "eighth", "nine": "ninth", "twelve": "twelfth",
}

_SMALL_VALUES = {word: value for value, word in enumerate(_ONES) if value}
_TENS_VALUES = {word: value for value, word in _TENS.items()}
_SCALE_VALUES = {word: value for value, word in _SCALES}


def _check_int(n):
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"expected an int, got {type(n).__name__}")


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
    """Spell out an integer in US English words."""
    _check_int(n)
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


def _ordinal_word(word):
    if word in _IRREGULAR_ORDINALS:
        return _IRREGULAR_ORDINALS[word]
    if word.endswith("y"):
        return word[:-1] + "ieth"
    return word + "th"


def to_ordinal(n):
    """Spell out a non-negative integer as an English ordinal."""
    _check_int(n)
    if n < 0:
        raise OutOfRangeError("ordinals are only defined for non-negative integers")
    words = to_words(n)
    head, sep, last = words.rpartition(" ")
    prefix, hyphen, unit = last.rpartition("-")
    return head + sep + prefix + hyphen + _ordinal_word(unit)


def ordinal_suffix(n):
    """Return "st", "nd", "rd" or "th" for an integer."""
    _check_int(n)
    n = abs(n)
    if 11 <= n % 100 <= 13:
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def to_ordinal_numeral(n):
    """Return the integer with its ordinal suffix, e.g. "21st"."""
    return f"{n}{ordinal_suffix(n)}"


def _token_value(token):
    if token in _SMALL_VALUES:
        return _SMALL_VALUES[token]
    if token in _TENS_VALUES:
        return _TENS_VALUES[token]
    if "-" in token:
        tens, _, unit = token.partition("-")
        if tens in _TENS_VALUES and unit in _SMALL_VALUES and _SMALL_VALUES[unit] <= 9:
            return _TENS_VALUES[tens] + _SMALL_VALUES[unit]
    return None


def from_words(text):
    """Parse English number words (as produced by to_words) back to an int."""
    if not isinstance(text, str):
        raise TypeError(f"expected a str, got {type(text).__name__}")
    tokens = text.lower().split()
    if not tokens:
        raise WordsParseError("empty input")
    negative = tokens[0] == "minus"
    if negative:
        tokens = tokens[1:]
        if not tokens:
            raise WordsParseError("'minus' must be followed by a number")
    if tokens == ["zero"]:
        if negative:
            raise WordsParseError("'minus zero' is not allowed")
        return 0

    total = 0
    group = 0
    stage = 0  # 0 empty, 1 single digit, 2 after "hundred", 3 group closed
    last_scale = None
    for token in tokens:
        if token in _SCALE_VALUES:
            scale = _SCALE_VALUES[token]
            if stage == 0:
                raise WordsParseError(f"{token!r} must follow a number")
            if last_scale is not None and scale >= last_scale:
                raise WordsParseError(f"{token!r} is out of order")
            total += group * scale
            last_scale = scale
            group, stage = 0, 0
        elif token == "hundred":
            if stage != 1:
                raise WordsParseError("'hundred' must follow one of one..nine")
            group *= 100
            stage = 2
        else:
            value = _token_value(token)
            if value is None:
                raise WordsParseError(f"unknown or misplaced word {token!r}")
            if stage == 0:
                group = value
                stage = 1 if value <= 9 else 3
            elif stage == 2:
                group += value
                stage = 3
            else:
                raise WordsParseError(f"unexpected word {token!r}")
    total += group
    return -total if negative else total

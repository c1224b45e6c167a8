"""numwords: numbers as English words, Roman numerals and compact formats."""

from .cardinal import (
    MAX_VALUE,
    from_words,
    ordinal_suffix,
    to_ordinal,
    to_ordinal_numeral,
    to_words,
)
from .compact import compact
from .errors import NumWordsError, OutOfRangeError, RomanNumeralError, WordsParseError
from .roman import from_roman, is_roman, to_roman

__all__ = [
    "MAX_VALUE",
    "NumWordsError",
    "OutOfRangeError",
    "RomanNumeralError",
    "WordsParseError",
    "compact",
    "from_roman",
    "from_words",
    "is_roman",
    "ordinal_suffix",
    "to_ordinal",
    "to_ordinal_numeral",
    "to_roman",
    "to_words",
]

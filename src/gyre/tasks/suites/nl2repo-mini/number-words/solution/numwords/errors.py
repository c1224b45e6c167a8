"""Exception types used by numwords."""


class NumWordsError(Exception):
    """Base class for every error raised deliberately by numwords."""


class OutOfRangeError(NumWordsError, ValueError):
    """A number lies outside the range an operation supports."""


class WordsParseError(NumWordsError, ValueError):
    """English number words could not be parsed."""


class RomanNumeralError(NumWordsError, ValueError):
    """A string is not a valid, canonical Roman numeral."""

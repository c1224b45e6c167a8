"""Exception types raised by semverlite."""


class SemverError(ValueError):
    """Base class of every error semverlite raises."""


class InvalidVersion(SemverError):
    """A version string or version component is not valid semver 2.0."""


class InvalidRange(SemverError):
    """A range expression cannot be parsed."""

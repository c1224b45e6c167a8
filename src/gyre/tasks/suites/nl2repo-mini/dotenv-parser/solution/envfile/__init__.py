"""envfile: read and write .env files."""

from .errors import EnvSyntaxError
from .interpolate import expand, references
from .parser import load, parse
from .writer import dump, dumps

__all__ = ["EnvSyntaxError", "dump", "dumps", "expand", "load", "parse", "references"]

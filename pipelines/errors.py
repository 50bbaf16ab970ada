"""Errors raised on bad input data."""

from __future__ import annotations


class DataError(ValueError):
    """Bad or unexpected input data.

    The message always names the file (or store/URL), the variable, level or option concerned, and
    what was expected instead, so a user can fix the input without reading the code.
    """

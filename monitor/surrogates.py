"""Lone UTF-16 surrogates: JSON may carry them (`"\\ud800"`) and Python's and msgspec's decoders
accept them, but they are not text: the database drivers cannot encode them (a 500), and a JSON
column would store them and break every later read of the row. Request bodies are refused with a
422 that names where the bad string is."""

from __future__ import annotations

from typing import Any


def is_valid_text(value: str) -> bool:
    """False if `value` holds a lone surrogate (it cannot be encoded as UTF-8)."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def surrogates_escaped(value: str) -> str:
    """`value` with lone surrogates written as `\\udXXX`, so that it can go into an error message."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def invalid_text_path(value: Any) -> str | None:
    """Path (`config.k[2]`, printable) of the first string, key or value, in a decoded JSON value
    that is not valid text; None if there is none."""
    found = _find(value, "")
    return None if found is None else surrogates_escaped(found) or "body"


def _find(value: Any, path: str) -> str | None:
    if isinstance(value, str):
        return None if is_valid_text(value) else path
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and not is_valid_text(key):
                return here
            found = _find(item, here)
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = _find(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None

"""The errors user input causes: `ConfigError` (a config key: path, value, what is
allowed, a close-match suggestion) and `DataError` (a data file: the row and column).
Both are `UserInputError`s: the CLI prints them as one line and exits 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

__all__ = ["ConfigError", "DataError", "InputError", "UserInputError", "check_field", "suggest"]


def suggest(word: str, candidates: Iterable[str]) -> str:
    """ "; did you mean 'x'?" for the closest candidate, or ""."""
    match = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


class UserInputError(Exception):
    """An error caused by what the user gave (config, data, plugins, paths, resources),
    with a message that names the field, the value and what was expected."""


class InputError(UserInputError, ValueError):
    """Any other error in reading what the user gave (data files, model, paths), re-raised
    with its type and message by the trainer's start-up checks."""


class DataError(UserInputError, ValueError):
    """A bad row of a data file: `source` (file or split name), `row` index, `column`."""

    def __init__(self, source: str, row: int, column: str, detail: str) -> None:
        self.source, self.row, self.column, self.detail = source, row, column, detail
        super().__init__(f"{source} row {row}, column {column!r}: {detail}")


class ConfigError(UserInputError, ValueError):
    """A bad key or value. `key` is the dotted path (relative to where it was raised;
    the config loader prefixes the section path), `detail` the rest of the message."""

    def __init__(self, key: str, detail: str) -> None:
        self.key = key
        self.detail = detail
        super().__init__(f"{key}: {detail}" if key else detail)

    def under(self, prefix: str) -> ConfigError:
        """The same error with `prefix.` in front of the key path."""
        return ConfigError(f"{prefix}.{self.key}" if prefix else self.key, self.detail)


def check_field(
    ok: bool, field: str, value: Any, expected: str, choices: Iterable[str] | None = None
) -> None:
    """Raise a ConfigError for `field` unless `ok`."""
    if ok:
        return
    hint = suggest(value, choices) if choices is not None and isinstance(value, str) else ""
    raise ConfigError(field, f"invalid value {value!r}; expected {expected}{hint}")

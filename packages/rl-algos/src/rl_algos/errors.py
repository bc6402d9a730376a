"""The errors user input causes: `ConfigError` (a config key: path, value, what is
allowed, a close-match suggestion; rl-core's, shared by every package) and `DataError` (a
data file: the row and column). The CLI prints each of `USER_ERRORS` as one line and
exits 2."""

from __future__ import annotations

from rl_core.config import ConfigError

__all__ = ["USER_ERRORS", "ConfigError", "DataError", "InputError", "UserInputError"]


class UserInputError(Exception):
    """An error in what the user gave; the message names the field, value and expectation."""


class InputError(UserInputError, ValueError):
    """Any other error reading the user's data, model or paths, re-raised at start-up."""


class DataError(UserInputError, ValueError):
    """A bad row of a data file: `source` (file or split name), `row` index, `column`."""

    def __init__(self, source: str, row: int, column: str, detail: str) -> None:
        self.source, self.row, self.column, self.detail = source, row, column, detail
        super().__init__(f"{source} row {row}, column {column!r}: {detail}")


USER_ERRORS: tuple[type[Exception], ...] = (UserInputError, ConfigError)
"""What the user's input caused: the CLI prints these as one line and exits 2."""

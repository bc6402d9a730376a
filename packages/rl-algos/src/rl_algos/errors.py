"""The errors user input causes: `ConfigError` (a config key: path, value, what is
allowed, a close-match suggestion; rl-core's, shared by every package) and `DataError` (a
data file: the row and column). The CLI prints each of `USER_ERRORS` as one line and
exits 2."""

from __future__ import annotations

from rl_core.config import ConfigError

__all__ = ["USER_ERRORS", "ConfigError", "DataError", "InputError", "UserInputError"]


class UserInputError(Exception):
    """An error caused by what the user gave (data, plugins, paths, resources), with a
    message that names the field, the value and what was expected."""


class InputError(UserInputError, ValueError):
    """Any other error in reading what the user gave (data files, model, paths), re-raised
    with its type and message by the trainer's start-up checks."""


class DataError(UserInputError, ValueError):
    """A bad row of a data file: `source` (file or split name), `row` index, `column`."""

    def __init__(self, source: str, row: int, column: str, detail: str) -> None:
        self.source, self.row, self.column, self.detail = source, row, column, detail
        super().__init__(f"{source} row {row}, column {column!r}: {detail}")


USER_ERRORS: tuple[type[Exception], ...] = (UserInputError, ConfigError)
"""What the user's input caused: the CLI prints these as one line and exits 2."""

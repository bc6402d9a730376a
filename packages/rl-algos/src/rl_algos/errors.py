"""The error every config and argument check raises: key path, value, what is allowed,
and a close-match suggestion."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

__all__ = ["ConfigError", "check_field", "suggest"]


def suggest(word: str, candidates: Iterable[str]) -> str:
    """ "; did you mean 'x'?" for the closest candidate, or ""."""
    match = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


class ConfigError(ValueError):
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

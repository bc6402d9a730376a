"""Helpers every typed config uses: number checks and dataclass-from-mapping.

Configs arrive as plain mappings (YAML, OmegaConf containers, ``engine_kwargs``); backends
turn them into their own dataclasses with `dataclass_from_dict`, which rejects unknown keys
with one error naming them and the fields that exist. Imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

__all__ = ["dataclass_from_dict", "is_int", "is_real"]

T = TypeVar("T")


def is_int(value: Any) -> bool:
    """An integer, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A finite int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _nested_dataclass(hint: Any) -> type | None:
    """The one dataclass type in ``hint`` (``X``, ``X | None``), or None."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    candidates = typing.get_args(hint) if union else (hint,)
    found = [t for t in candidates if isinstance(t, type) and dataclasses.is_dataclass(t)]
    return found[0] if len(found) == 1 else None


def dataclass_from_dict(cls: type[T], data: Any, where: str) -> T:
    """Build the dataclass ``cls`` from a mapping of its field names; fields typed as a
    dataclass (or ``dataclass | None``) are built from nested mappings the same way.

    ``where`` names the mapping in errors (e.g. ``"EngineConfig.engine_kwargs"``). Raises
    ``ValueError`` for a value that is not a mapping and for unknown keys; the values
    themselves are checked by the dataclass (its ``validate`` or ``__post_init__``).
    """
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ValueError(
            f"{where}={data!r} is invalid: expected a mapping of {cls.__name__} fields"
        )
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(str(k) for k in set(data) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; expected some of {sorted(fields)}")
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):  # an annotation only importable under TYPE_CHECKING
        hints = {name: f.type for name, f in fields.items() if not isinstance(f.type, str)}
    kwargs = {}
    for key, value in data.items():
        nested = _nested_dataclass(hints.get(key))
        if nested is not None and isinstance(value, Mapping):
            value = dataclass_from_dict(nested, value, f"{where}.{key}")
        kwargs[key] = value
    return cls(**kwargs)

"""Lazy package attributes: a package names what it exports and from which module, and
the module is imported on first access (PEP 562 ``__getattr__``/``__dir__``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(
    package: str, exports: dict[str, str], extra: tuple[str, ...] = ()
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for ``package``, whose attribute
    ``name`` lives in module ``exports[name]``; ``extra`` names attributes the package
    defines itself."""
    names = sorted([*exports, *extra])

    def getattr_(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    def dir_() -> list[str]:
        return names

    return names, getattr_, dir_

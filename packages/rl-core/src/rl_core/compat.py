"""Version compatibility between rl-core and the packages built on it.

Each sibling package calls ``require_core("<its distribution>")`` at import: the installed
rl-core must satisfy the range that package declares in its metadata (read with
`importlib.metadata`), or the import fails with one line naming both versions.
"""

from __future__ import annotations

import re
from importlib import metadata

__all__ = ["IncompatibleCoreError", "check_core_range", "require_core"]

_CLAUSE = re.compile(r"^\s*(~=|==|!=|<=|>=|<|>)\s*([0-9][0-9.]*)\s*$")


class IncompatibleCoreError(ImportError):
    """The installed rl-core is outside the range a package declares."""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])


def _satisfies(version: str, specifier: str) -> bool:
    have = _version(version)
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        match = _CLAUSE.match(clause)
        if match is None:
            continue  # a form this check does not read (pip enforced it at install)
        op, raw = match.groups()
        want = _version(raw)
        width = max(len(have), len(want))
        h, w = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
        ok = {
            "==": h == w,
            "!=": h != w,
            ">=": h >= w,
            "<=": h <= w,
            ">": h > w,
            "<": h < w,
            "~=": h >= w and h[: len(want) - 1] == w[: len(want) - 1],
        }[op]
        if not ok:
            return False
    return True


def check_core_range(dist: str, dist_version: str, requires: list[str], core_version: str) -> None:
    """Raise `IncompatibleCoreError` unless ``core_version`` fits the ``rl-core``
    requirement among ``requires`` (requirement strings as in package metadata)."""
    for req in requires:
        if ";" in req and "extra ==" in req.split(";", 1)[1]:
            continue  # a requirement of an extra
        match = re.match(r"^\s*rl[-_]core\s*(\[[^\]]*\])?\s*(.*?)\s*(;.*)?$", req)
        if match is None:
            continue
        specifier = match.group(2).strip("() ")
        if not _satisfies(core_version, specifier):
            raise IncompatibleCoreError(
                f"{dist} {dist_version} requires rl-core{specifier} but rl-core {core_version} "
                f"is installed: install a matching rl-core (pip install 'rl-core{specifier}')"
            )


def require_core(dist: str) -> None:
    """Check the installed rl-core against ``dist``'s declared range (no-op when either
    distribution has no metadata, e.g. a source tree on ``sys.path``)."""
    try:
        dist_version = metadata.version(dist)
        requires = metadata.requires(dist) or []
        core_version = metadata.version("rl-core")
    except metadata.PackageNotFoundError:
        return
    check_core_range(dist, dist_version, requires, core_version)

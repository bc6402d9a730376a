"""Version compatibility between rl-core and the packages built on it.

Each sibling package calls ``require_core("<its distribution>")`` at import: the installed
rl-core must satisfy the range that package declares in its metadata (read with
`importlib.metadata`), or the import fails with one line naming both versions.

Requirements, ranges and versions are read with `packaging` (the PyPA reference
implementation of PEP 508 / PEP 440, the same code pip uses), so every form PEP 440 allows
is understood: ``~=``, ``==0.1.*``, ``!=0.1.*``, ``===``, pre/post/dev releases, epochs,
local versions and environment markers. A requirement or version that is not valid
PEP 508 / PEP 440 raises `InvalidCoreRangeError` instead of being skipped.
"""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

__all__ = ["IncompatibleCoreError", "InvalidCoreRangeError", "check_core_range", "require_core"]

_CORE = canonicalize_name("rl-core")


class IncompatibleCoreError(ImportError):
    """The installed rl-core is outside the range a package declares."""


class InvalidCoreRangeError(IncompatibleCoreError):
    """A package's rl-core requirement (or rl-core's own version) cannot be parsed."""


def _names_core(requirement: str) -> bool:
    """Whether an unparseable requirement string is about rl-core (its leading name)."""
    head = requirement.strip()
    end = 0
    while end < len(head) and (head[end].isalnum() or head[end] in "-_."):
        end += 1
    return bool(head[:end]) and canonicalize_name(head[:end]) == _CORE


def _core_requirements(dist: str, dist_version: str, requires: list[str]) -> list[Requirement]:
    """The unconditional rl-core requirements among ``requires`` (markers evaluated for this
    interpreter with no extra selected, so a requirement of an extra does not count)."""
    found = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            if _names_core(text):
                raise InvalidCoreRangeError(
                    f"{dist} {dist_version} declares an rl-core requirement {text!r} that is "
                    f"not valid PEP 508: {str(exc).splitlines()[0]}"
                ) from exc
            continue  # not ours to judge
        if canonicalize_name(req.name) != _CORE:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        found.append(req)
    return found


def check_core_range(dist: str, dist_version: str, requires: list[str], core_version: str) -> None:
    """Raise `IncompatibleCoreError` unless ``core_version`` fits the ``rl-core``
    requirement among ``requires`` (requirement strings as in package metadata), and
    `InvalidCoreRangeError` when that requirement or ``core_version`` cannot be parsed."""
    requirements = _core_requirements(dist, dist_version, requires)
    if not requirements:
        return
    try:
        version = Version(core_version)
    except InvalidVersion as exc:
        raise InvalidCoreRangeError(
            f"the installed rl-core has version {core_version!r}, which is not valid PEP 440 "
            f"(so {dist} {dist_version}'s range cannot be checked)"
        ) from exc
    for req in requirements:
        # prereleases=True: the installed version is a fact, not a candidate to choose;
        # a dev build 0.1.1.dev0 fits ">=0.1,<0.2" (and "<0.2" still refuses 0.2.0rc1).
        if not req.specifier.contains(version, prereleases=True):
            specifier = str(req.specifier)
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

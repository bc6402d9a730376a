"""Find implementations by name: in-process registrations first, then entry points.

Every extension point is one `Registry` bound to an entry point group (`rl.engines`,
`rl.rollouts`, `rl.platforms`, ...). A third-party package publishes an implementation by
declaring, in its own pyproject.toml::

    [project.entry-points."rl.engines"]
    my-engine = "my_pkg.engine:MyEngine"

and a config saying ``engine: my-engine`` finds it. Code in the same process (tests,
notebooks) can also register directly with ``@REGISTRY.register("name")``.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

T = TypeVar("T")

__all__ = ["PluginLoadError", "Registry", "UnknownPluginError"]


class UnknownPluginError(KeyError):
    """No implementation of that name is registered or installed."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


class PluginLoadError(ImportError):
    """The implementation is installed but could not be imported (usually a missing extra)."""


class Registry(Generic[T]):
    """Name -> implementation lookup for one entry point group."""

    def __init__(self, group: str, kind: str | None = None) -> None:
        self.group = group
        self.kind = kind or group.rsplit(".", 1)[-1]
        self._local: dict[str, T] = {}
        self._loaded: dict[str, T] = {}
        self._lock = threading.Lock()

    def register(self, name: str, obj: T | None = None, *, overwrite: bool = False) -> Any:
        """Register `obj` under `name`; without `obj`, return a decorator."""

        def add(target: T) -> T:
            with self._lock:
                if name in self._local and self._local[name] is not target and not overwrite:
                    raise ValueError(
                        f"{self.group}: '{name}' is already registered as "
                        f"{self._local[name]!r}; pass overwrite=True to replace it"
                    )
                self._local[name] = target
            return target

        return add(obj) if obj is not None else add

    def unregister(self, name: str) -> None:
        with self._lock:
            self._local.pop(name, None)

    def _entry_points(self) -> dict[str, EntryPoint]:
        return {ep.name: ep for ep in entry_points(group=self.group)}

    def names(self) -> list[str]:
        """Every name that `get` can resolve, sorted."""
        return sorted(set(self._local) | set(self._entry_points()))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()

    def get(self, name: str) -> T:
        """The implementation registered as `name`; a clear error when there is none."""
        if name in self._local:
            return self._local[name]
        if name in self._loaded:
            return self._loaded[name]
        eps = self._entry_points()
        if name not in eps:
            known = self.names()
            hint = difflib.get_close_matches(name, known, n=1)
            msg = (
                f"unknown {self.kind} {name!r} (entry point group '{self.group}'); "
                f"installed: {', '.join(known) if known else 'none'}"
            )
            if hint:
                msg += f"; did you mean {hint[0]!r}?"
            raise UnknownPluginError(msg)
        ep = eps[name]
        dist = ep.dist.name if ep.dist is not None else "its package"
        try:
            obj = ep.load()
        except ImportError as exc:
            raise PluginLoadError(
                f"{self.kind} {name!r} is provided by {dist} ({ep.value}) but could not be "
                f"imported: {exc}. It probably needs an optional extra: "
                f"pip install '{dist}[{name}]'"
            ) from exc
        with self._lock:
            self._loaded[name] = obj
        return obj

    def build(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Look up `name` and call it (a class or factory) with the given arguments."""
        factory: Callable[..., Any] = self.get(name)  # type: ignore[assignment]
        return factory(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Registry({self.group!r}, names={self.names()})"

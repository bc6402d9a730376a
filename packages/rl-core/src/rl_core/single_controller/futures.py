"""`GroupFuture`: the pending result of a non-blocking worker-group call."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Any, Protocol

__all__ = ["GroupFuture"]


class Collector(Protocol):
    """What a future needs of `rl_core.single_controller.dispatch.Collector` (a protocol
    here, so that this module does not import the dispatch module that imports it)."""

    kind: str
    ranks: tuple[int, ...]
    role: str
    method: str

    def combine(self, outputs: list[Any], metas: list[dict[str, Any]]) -> Any: ...


_UNSET = object()


class GroupFuture(ABC):
    """The result of a call to a method registered with ``blocking=False``.

    Pass it directly as an argument of the next group call: the receiving workers fetch
    the data they need from the workers that produced it (with DataProto dispatch each
    rank fetches only the rows of its own chunk), and nothing goes through the driver.
    ``result()`` waits and returns what a blocking call would have returned. Errors of
    the call surface at ``result()`` or in the call that consumes the future.
    """

    def __init__(self, collector: Collector, default_timeout_s: float | None) -> None:
        self._collector = collector
        self._default_timeout_s = default_timeout_s
        self._value: Any = _UNSET
        self._lock = threading.Lock()

    @property
    def collector(self) -> Collector:
        """How the ranks' outputs combine (which ranks, list/DataProto/custom)."""
        return self._collector

    @property
    def role(self) -> str:
        return self._collector.role

    @property
    def method(self) -> str:
        return self._collector.method

    def describe(self) -> str:
        kind = {"list": "a list", "first": "one output", "proto": "a DataProto"}.get(
            self._collector.kind, "a custom-collected value"
        )
        return f"{self.role}.{self.method}() ({kind} from ranks {list(self._collector.ranks)})"

    def result(self, timeout_s: float | None = None) -> Any:
        """Wait (at most `timeout_s`, default: the group's call time-out) and return the result."""
        with self._lock:
            if self._value is _UNSET:
                timeout = self._default_timeout_s if timeout_s is None else timeout_s
                outputs, metas = self._gather(timeout)
                self._value = self._collector.combine(outputs, metas)
            return self._value

    @abstractmethod
    def done(self) -> bool:
        """True when every rank has finished (successfully or not)."""

    @abstractmethod
    def _gather(self, timeout_s: float | None) -> tuple[list[Any], list[dict[str, Any]]]:
        """Wait for the call; return the outputs and metas of the collector's ranks, in order."""

    def __reduce__(self):
        raise TypeError(
            f"a GroupFuture ({self.describe()}) can only be passed as a direct argument of a "
            "worker-group call, not inside a container or to other code; call .result() to "
            "get its value"
        )

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<GroupFuture {self.describe()} {state}>"

"""Failover: what the trainer does when a worker process is lost (README: Failover).

On `WorkerDiedError`, `WorkerHungError` or `WorkerTimeoutError`, `RLTrainer._recover` stops
the async producer, kills the lost group with every role sharing its processes, waits
``trainer.restart_backoff_s`` (doubled per restart), rebuilds the group on the same
placement and restores a snapshot, checkpoint or the initial state. `WorkerError` (raised
by a worker's own code) is never retried.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from rl_core.single_controller import (
    WorkerDiedError,
    WorkerGroupError,
    WorkerHungError,
    WorkerTimeoutError,
)

__all__ = ["FailoverPolicy", "RestartEvent", "lost_worker"]

log = logging.getLogger(__name__)


def lost_worker(exc: BaseException) -> WorkerGroupError | None:
    """The lost-process error in `exc`'s cause chain (itself included), or None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, WorkerDiedError | WorkerHungError | WorkerTimeoutError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _cause(error: WorkerGroupError) -> str:
    if isinstance(error, WorkerHungError):
        operation = getattr(error, "operation", None)
        if operation is not None:
            return (
                f"hung in a collective ({operation} during {error.method}(), timed out after "
                f"{error.timeout_s:g} s: trainer.collective_timeout_s)"
            )
        return f"hung (no heartbeat within {error.timeout_s:g} s during {error.method}())"
    if isinstance(error, WorkerTimeoutError):
        return f"hung ({error.method}() past its {error.timeout_s:g} s time-out)"
    assert isinstance(error, WorkerDiedError)
    return f"died during {error.method}(): {error.detail[:160]}"


@dataclass
class RestartEvent:
    """One failover: who was lost, why, and how long each phase took (monotonic seconds)."""

    role: str
    rank: int | None
    cause: str
    detected_at: float
    resumed_step: int = 0
    restored_from: str | None = None
    rebuilt_at: float = 0.0


@dataclass
class FailoverPolicy:
    """``trainer.max_restarts`` with a doubling back-off; keeps the events of the run."""

    max_restarts: int
    backoff_s: float
    events: list[RestartEvent] = field(default_factory=list)

    @property
    def restarts(self) -> int:
        return len(self.events)

    def admit(self, error: WorkerGroupError) -> RestartEvent | None:
        """A new restart for `error`, after its back-off; None when the bound is reached."""
        if self.restarts >= self.max_restarts:
            log.error(
                "failover: trainer.max_restarts=%d reached; stopping the run", self.max_restarts
            )
            return None
        rank = getattr(error, "rank", None)
        ranks = getattr(error, "ranks", None)
        if rank is None and ranks:
            rank = ranks[0]
        event = RestartEvent(error.role, rank, _cause(error), time.monotonic())
        delay = self.backoff_s * 2**self.restarts
        self.events.append(event)
        if delay > 0:
            time.sleep(delay)
        return event

    def log_restart(self, event: RestartEvent) -> None:
        """The one line each restart leaves in the log."""
        log.warning(
            "failover %d/%d: group %r rank %s %s; rebuilt it and resumed from step %d (%s)",
            self.restarts,
            self.max_restarts,
            event.role,
            event.rank,
            event.cause,
            event.resumed_step,
            event.restored_from or "no checkpoint yet: the initial weights",
        )

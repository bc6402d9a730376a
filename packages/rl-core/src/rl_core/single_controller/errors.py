"""Errors raised by worker groups: every one names the role, the rank(s) and the method."""

from __future__ import annotations

__all__ = [
    "DispatchError",
    "ResourcePoolError",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroupError",
    "WorkerHungError",
    "WorkerTimeoutError",
]


def _where(role: str, rank: int | None, node_ip: str | None, node_id: str | None) -> str:
    text = f"{role!r} rank {rank}" if rank is not None else f"{role!r}"
    if node_ip or node_id:
        node = node_ip or "?"
        if node_id:
            node += f" (node {node_id[:12]})"
        text += f" on {node}"
    return text


class WorkerGroupError(RuntimeError):
    """Base class of the errors a worker group raises on the driver."""


class DispatchError(WorkerGroupError, ValueError):
    """Arguments that the method's dispatch mode cannot split; raised before anything is sent."""


class ResourcePoolError(WorkerGroupError):
    """The cluster could not grant a resource pool (in time)."""


class WorkerError(WorkerGroupError):
    """A worker's method raised. Carries the original type, message and remote traceback.

    ``original`` is the exception object itself when it could be sent back (picklable),
    else None; ``exc_type`` and ``exc_message`` are always there.
    """

    def __init__(
        self,
        role: str,
        rank: int | None,
        method: str,
        exc_type: str,
        exc_message: str,
        remote_traceback: str,
        node_ip: str | None = None,
        node_id: str | None = None,
        original: BaseException | None = None,
    ) -> None:
        self.role, self.rank, self.method = role, rank, method
        self.exc_type, self.exc_message = exc_type, exc_message
        self.remote_traceback = remote_traceback
        self.node_ip, self.node_id, self.original = node_ip, node_id, original
        text = (
            f"{_where(role, rank, node_ip, node_id)} raised {exc_type} in {method}(): {exc_message}"
        )
        if remote_traceback:
            text += f"\n--- remote traceback ({role} rank {rank}) ---\n{remote_traceback.rstrip()}"
        super().__init__(text)

    def __reduce__(self):
        return (
            WorkerError,
            (
                self.role,
                self.rank,
                self.method,
                self.exc_type,
                self.exc_message,
                self.remote_traceback,
                self.node_ip,
                self.node_id,
                self.original,
            ),
        )


class WorkerDiedError(WorkerGroupError):
    """A worker process died (killed, crashed, exited) while or before running a call."""

    def __init__(
        self,
        role: str,
        rank: int | None,
        method: str,
        detail: str,
        node_ip: str | None = None,
        node_id: str | None = None,
    ) -> None:
        self.role, self.rank, self.method, self.detail = role, rank, method, detail
        self.node_ip, self.node_id = node_ip, node_id
        super().__init__(f"{_where(role, rank, node_ip, node_id)} died during {method}(): {detail}")

    def __reduce__(self):
        args = (self.role, self.rank, self.method, self.detail, self.node_ip, self.node_id)
        return (WorkerDiedError, args)


class WorkerTimeoutError(WorkerGroupError, TimeoutError):
    """A call did not finish within its time-out; names the ranks still running."""

    def __init__(self, role: str, method: str, ranks: list[int], timeout_s: float) -> None:
        self.role, self.method, self.ranks, self.timeout_s = role, method, list(ranks), timeout_s
        super().__init__(
            f"{role!r} {method}() did not finish within {timeout_s:g} s on rank(s) "
            f"{self.ranks}; the worker(s) may be hung (a collective waiting for a dead peer?) "
            "or the time-out too short. The group is now unusable: shut it down."
        )

    def __reduce__(self):
        return (WorkerTimeoutError, (self.role, self.method, self.ranks, self.timeout_s))


class WorkerHungError(WorkerTimeoutError):
    """A worker process is alive but hung, noticed long before the call's own time-out:
    it did not answer the group's heartbeat in time (frozen, or stuck holding the
    interpreter), or, with ``operation`` set, it waited inside a collective (e.g. a
    ``recv`` whose message never comes) until its process group's time-out ran out."""

    def __init__(
        self,
        role: str,
        method: str,
        ranks: list[int],
        heartbeat_timeout_s: float,
        operation: str | None = None,
    ):
        if operation is None:
            text = (
                f"{role!r} rank(s) {list(ranks)} did not answer a heartbeat within "
                f"{heartbeat_timeout_s:g} s during {method}(): the process is alive but hung"
            )
        else:
            text = (
                f"{role!r} rank(s) {list(ranks)} stuck in a collective ({operation}) during "
                f"{method}(): it timed out after {heartbeat_timeout_s:g} s waiting for peers "
                "that never joined (a rank hung or lost)"
            )
        WorkerGroupError.__init__(self, text)
        self.role, self.method, self.ranks = role, method, list(ranks)
        self.timeout_s = heartbeat_timeout_s
        self.operation = operation
        self.rank = self.ranks[0] if self.ranks else None

    def __reduce__(self):
        args = (self.role, self.method, self.ranks, self.timeout_s, self.operation)
        return (WorkerHungError, args)

"""Whether an error says a rollout replica itself is gone (a leaf module: the failover
and the weight sync both ask it)."""

from __future__ import annotations

__all__ = ["LOST", "replica_lost"]

# a dead Ray actor, or a server that closed / refused the connection
LOST = {
    "RayActorError",
    "ActorDiedError",
    "ActorUnavailableError",
    "ConnectError",
    "RemoteProtocolError",
    "ReadError",
    "WriteError",
}


def replica_lost(exc: BaseException) -> bool:
    """Whether `exc` (or an error in its cause chain) says the replica itself is gone."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if any(cls.__name__ in LOST for cls in type(current).__mro__):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False

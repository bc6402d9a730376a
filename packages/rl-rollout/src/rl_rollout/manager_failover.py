"""Rollout-side failover: a lost replica is replaced or dropped, its requests go again.

``RolloutManagerConfig.on_replica_loss``:

* ``fail`` (the manager's default): the request's error ends the batch (named);
* ``drop``: the replica leaves the load balancer (the pool shrinks); its in-flight requests
  are issued again to the replicas left;
* ``replace`` (placement ``split``): as ``drop``, and a new Ray actor with the same
  resources takes the replica's place. It serves only once the trainer's next weight sync
  reached it (before any sync the pool serves the initial weights, which the new replica
  loads itself). A remote server is not ours to restart: ``replace`` drops it.

A replica counts as lost when the error behind a request is its process's death (Ray's
actor errors) or a broken connection to a server; a time-out or an engine's own error is
not a loss (it fails as before). Each request is issued until one replica answers, so every
row gets exactly one response: no sample is lost or generated twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from rl_rollout.manager_replicas import RayReplica, RolloutReplicaError
from rl_rollout.replica_loss import replica_lost

__all__ = ["ReplicaFailover", "ReplicaPool", "replica_lost"]

log = logging.getLogger(__name__)


class ReplicaPool(Protocol):
    """What failover uses of its `rl_rollout.manager.RolloutManager` (a protocol: the
    manager imports this module, never the other way round)."""

    config: Any
    balancer: Any
    replicas: list[Any]
    dropped: set[int]
    engine_factory: Any
    policy_version: int


class ReplicaFailover:
    """The manager's record of lost replicas and what was done (module docstring)."""

    def __init__(self, manager: ReplicaPool) -> None:
        self.manager = manager
        self.mode = manager.config.on_replica_loss
        self.lost = 0
        self.replaced = 0
        self.reissued = 0
        self.generation = 0  # changes when the set of replicas that take weights changes
        self.waiting_for_weights: set[int] = set()
        self._lock: asyncio.Lock | None = None

    async def handle(self, index: int, replica: Any, exc: BaseException) -> bool:
        """After `replica` (number `index`) failed a request with `exc`: True when the
        request should go again (the replica was dropped or replaced), False to raise."""
        if self.mode == "fail" or not replica_lost(exc):
            return False
        manager = self.manager
        balancer = manager.balancer
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if manager.replicas[index] is replica and balancer.serving[index]:
                await self._lose(index, replica, exc)
        if not any(balancer.serving):
            waiting = sorted(self.waiting_for_weights)
            raise RolloutReplicaError(
                f"no rollout replica left to serve: {replica.where()} was lost ({exc}); "
                + (
                    f"replica(s) {waiting} replaced it but serve only after the next weight sync"
                    if waiting
                    else "every replica is lost"
                )
            ) from exc
        self.reissued += 1
        return True

    async def _lose(self, index: int, replica: Any, exc: BaseException) -> None:
        manager, config = self.manager, self.manager.config
        manager.balancer.serving[index] = False
        self.lost += 1
        self.generation += 1
        replace = self.mode == "replace" and config.placement == "split"
        left = sum(manager.balancer.serving)
        log.warning(
            "rollout failover: %s lost (%s); %s",
            replica.where(),
            str(exc).splitlines()[0][:200],
            "starting a replacement" if replace else f"dropped, {left} replica(s) left",
        )
        if not replace:
            manager.dropped.add(index)
            return
        new = RayReplica(
            index,
            config.rollout,
            manager.engine_factory,
            config.num_cpus_per_replica,
            config.num_gpus_per_replica,
            config.max_concurrency_per_replica,
        )
        with contextlib.suppress(Exception):
            import ray

            ray.kill(replica.actor)
        try:
            await new.start(config.start_timeout_s)
        except BaseException:
            manager.dropped.add(index)
            with contextlib.suppress(Exception):
                await new.shutdown()
            raise
        manager.replicas[index] = new
        self.replaced += 1
        if manager.policy_version == 0:  # no sync yet: it loaded the weights the pool serves
            manager.balancer.serving[index] = True
        else:
            self.waiting_for_weights.add(index)
        log.warning(
            "rollout failover: %s replaces it%s",
            new.where(),
            "" if manager.balancer.serving[index] else "; it serves after the next weight sync",
        )

    def weights_synced(self) -> None:
        """Every replica that takes weights got the latest: replacements may serve."""
        for index in sorted(self.waiting_for_weights):
            self.manager.balancer.serving[index] = True
        self.waiting_for_weights.clear()

    def metrics(self) -> dict[str, float]:
        return {
            "rollout/replicas_lost": float(self.lost),
            "rollout/replicas_replaced": float(self.replaced),
            "rollout/requests_reissued": float(self.reissued),
        }

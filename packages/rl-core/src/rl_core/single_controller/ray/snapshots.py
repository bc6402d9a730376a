"""Snapshot holders: host memory outside the worker groups for the ranks' in-memory snapshots.

A rank's snapshot (`rl_core.engine.snapshot`: a flat host buffer and its layout) must
survive the rank's own process, so it cannot stay in that process or in the object-store
entries it owns (Ray frees an object when its owner dies). It goes to a `SnapshotHolder`: a
Ray actor that reserves no CPU, is owned by the driver (it ends with the run) and copies
what it receives into its own memory. There is one holder per node that runs training
ranks; a rank sends to the holder of the *next* node in the sorted list of those nodes (its
own node's when there is one), so a lost process, and on two nodes or more a lost node,
leaves the copy intact. A holder keeps the newest `KEEP` snapshots of each (role, rank):
the newest complete one stays while the next is written.

`SnapshotStore` is the driver's side: it starts the holders (and replaces a dead one),
hands the workers a picklable `SnapshotTarget` (``send`` / ``fetch``), and says which
steps a set of ranks holds completely.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

__all__ = ["KEEP", "SnapshotHolder", "SnapshotStore", "SnapshotTarget"]

log = logging.getLogger(__name__)

KEEP = 2  # snapshots per (role, rank): the newest complete one and the one being written


class SnapshotHolder:
    """Keeps snapshots of ranks by (role, rank, step) in this process's memory."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._held: dict[tuple[str, int], dict[int, tuple[Any, np.ndarray]]] = {}

    def put(self, role: str, rank: int, step: int, meta: Any, data: np.ndarray) -> int:
        """Store a copy of `data` (the sender's buffer; its object dies with the sender) as
        the snapshot of (role, rank) at `step`; returns the bytes held for it."""
        with self._lock:
            held = self._held.setdefault((role, rank), {})
            reuse = None
            if len(held) >= self.keep:  # the oldest one's memory takes the new one
                oldest = min(held)
                _, old = held.pop(oldest)
                if old.shape == data.shape and old.dtype == data.dtype:
                    reuse = old
        copy = reuse if reuse is not None else np.empty_like(data)
        np.copyto(copy, data)
        with self._lock:
            held = self._held.setdefault((role, rank), {})
            held[step] = (meta, copy)
            for old_step in sorted(held)[: max(0, len(held) - self.keep)]:
                del held[old_step]
        return int(copy.nbytes)

    def get(self, role: str, rank: int, step: int) -> tuple[Any, np.ndarray] | None:
        with self._lock:
            return self._held.get((role, rank), {}).get(step)

    def inventory(self) -> list[tuple[str, int, int]]:
        """(role, rank, step) of every snapshot held."""
        with self._lock:
            return [
                (role, rank, step) for (role, rank), held in self._held.items() for step in held
            ]

    def drop_after(self, step: int) -> None:
        """Forget the snapshots of steps after `step` (a timeline the run went back from)."""
        with self._lock:
            for held in self._held.values():
                for later in [s for s in held if s > step]:
                    del held[later]

    def nbytes(self) -> int:
        with self._lock:
            return sum(a.nbytes for held in self._held.values() for _, a in held.values())


_RemoteHolder = ray.remote(num_cpus=0, max_concurrency=16)(SnapshotHolder)


@dataclass
class SnapshotTarget:
    """What a worker needs to send its snapshot to a holder and fetch it back (picklable:
    it travels as a call argument)."""

    holders: dict[str, Any]  # node id -> holder handle

    def holder_for(self, node_id: str) -> Any:
        """The holder of the node after `node_id` (sorted), `node_id`'s own when alone."""
        nodes = sorted(self.holders)
        index = nodes.index(node_id) if node_id in nodes else -1
        return self.holders[nodes[(index + 1) % len(nodes)]]

    def send(
        self, role: str, rank: int, node_id: str, step: int, meta: Any, data: np.ndarray
    ) -> int:
        """Store (role, rank)'s snapshot of `step` on its holder; returns the bytes held."""
        return int(ray.get(self.holder_for(node_id).put.remote(role, rank, step, meta, data)))

    def fetch(self, role: str, rank: int, step: int) -> tuple[Any, np.ndarray]:
        """(meta, data) of (role, rank)'s snapshot of `step`, from whichever holder has it."""
        for holder in self.holders.values():
            try:
                found = ray.get(holder.get.remote(role, rank, step))
            except ray.exceptions.RayActorError:
                continue
            if found is not None:
                return found
        raise LookupError(
            f"no snapshot of {role!r} rank {rank} at step {step} in the holders on nodes "
            f"{sorted(self.holders)}"
        )


class SnapshotStore:
    """The driver's side of the holders (module docstring)."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self._holders: dict[str, Any] = {}

    def target(self, node_ids: Iterable[str]) -> SnapshotTarget:
        """A target over holders on `node_ids` (the nodes of the training ranks): a holder
        is started where there is none and replaced where it died."""
        for node_id in sorted(set(node_ids)):
            if node_id not in self._holders:
                strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
                self._holders[node_id] = _RemoteHolder.options(
                    scheduling_strategy=strategy
                ).remote()
        return SnapshotTarget(dict(self._holders))

    def wait_started(self, timeout_s: float = 300.0) -> None:
        """Return once every holder runs (a new Ray actor takes seconds to start)."""
        ray.get([h.nbytes.remote() for h in self._holders.values()], timeout=timeout_s)

    def _live(self) -> dict[str, list[tuple[str, int, int]]]:
        """node id -> inventory of every holder that answers; the others are forgotten."""
        refs = {node: h.inventory.remote() for node, h in self._holders.items()}
        found: dict[str, list[tuple[str, int, int]]] = {}
        for node, ref in refs.items():
            try:
                found[node] = ray.get(ref, timeout=self.timeout_s)
            except Exception as exc:  # a dead holder (its node lost): its snapshots are gone
                log.warning("snapshot holder on node %s is gone: %s", node[:12], exc)
                self._holders.pop(node, None)
        return found

    def held_steps(self) -> dict[tuple[str, int], set[int]]:
        """(role, rank) -> the steps of its snapshots the live holders keep."""
        steps: dict[tuple[str, int], set[int]] = {}
        for inventory in self._live().values():
            for role, rank, step in inventory:
                steps.setdefault((role, rank), set()).add(step)
        return steps

    def missing(self, world_sizes: Mapping[str, int], step: int) -> list[tuple[str, int]]:
        """The (role, rank)s (role -> world size) whose snapshot of `step` no live holder
        has: empty when the snapshot is complete."""
        held = self.held_steps()
        return [
            (role, rank)
            for role, size in world_sizes.items()
            for rank in range(size)
            if step not in held.get((role, rank), ())
        ]

    def drop_after(self, step: int) -> None:
        for holder in self._holders.values():
            holder.drop_after.remote(step)

    def nbytes(self) -> int:
        """Host bytes the live holders keep."""
        refs = [h.nbytes.remote() for h in self._holders.values()]
        total = 0
        for ref in refs:
            try:
                total += int(ray.get(ref, timeout=self.timeout_s))
            except Exception:  # a dead holder keeps nothing
                continue
        return total

    def shutdown(self) -> None:
        for holder in self._holders.values():
            try:
                ray.kill(holder)
            except Exception:  # already gone
                continue
        self._holders.clear()

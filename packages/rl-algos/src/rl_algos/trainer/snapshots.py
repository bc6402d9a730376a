"""In-memory snapshots: failover that loses at most the step in flight (README: Failover).

Each trained rank sends `TrainEngine.snapshot_view` from a background thread to a holder
(`rl_core.single_controller.ray.snapshots`); its next update or load waits for the send
(`RankSnapshots.wait`). The driver keeps its own state of the step. A snapshot is complete
when both are; `RLTrainer._recover` restores the newest complete one (or a newer checkpoint).
"""

from __future__ import annotations

import copy
import logging
import random
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from rl_core.engine import HostSnapshot, TrainEngine
from rl_core.engine.snapshot import layout_from, unpack

__all__ = ["RankSnapshots", "Snapshots", "driver_rng_state", "set_driver_rng_state"]

log = logging.getLogger(__name__)

# how long failover waits for the newest snapshot of ranks that are alive to arrive
SETTLE_S = 10.0


class RankSnapshots:
    """One rank's side (module docstring): capture now, copy and send in the background."""

    def __init__(self) -> None:
        self.host = HostSnapshot()
        self._thread: threading.Thread | None = None
        self._last: dict[str, Any] = {}

    def begin(
        self, engine: TrainEngine, step: int, send: Callable[[int, dict[str, Any], Any], Any]
    ) -> dict[str, Any]:
        """Capture `engine`'s state of `step`, send it with ``send(step, meta, data)`` in the
        background; return the previous snapshot's bytes and seconds (or error), or {}."""
        start = time.perf_counter()
        self.wait()
        previous, self._last = self._last, {}
        self.host.capture(engine.snapshot_view())
        captured = time.perf_counter() - start
        self._thread = threading.Thread(
            target=self._send, args=(step, send, captured), name=f"snapshot-{step}", daemon=True
        )
        self._thread.start()
        return previous

    def _send(
        self, step: int, send: Callable[[int, dict[str, Any], Any], Any], captured: float
    ) -> None:
        start = time.perf_counter()
        try:
            self.host.wait_copied()
            copied = time.perf_counter()
            meta = {"state": self.host.state, "layout": self.host.describe()}
            send(step, meta, self.host.buffer.numpy())
            self._last = {
                "host_bytes": self.host.nbytes,
                "capture_s": captured,
                "copy_s": copied - start,
                "send_s": time.perf_counter() - copied,
            }
        except BaseException as exc:  # reported by the next `begin`
            self._last = {"error": f"{type(exc).__name__}: {exc}"}

    def wait(self) -> None:
        """Return once the snapshot in flight (if any) is copied and sent."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def restore(self, engine: TrainEngine, meta: dict[str, Any], data: Any) -> None:
        """Write a snapshot fetched from a holder into `engine`."""
        self.wait()
        with warnings.catch_warnings():  # the holder's read-only buffer is only read
            warnings.filterwarnings("ignore", message=".*not writable.*")
            buffer = torch.from_numpy(np.asarray(data))
        engine.restore_snapshot(meta["state"], unpack(layout_from(meta["layout"]), buffer))


def driver_rng_state() -> dict[str, Any]:
    """The driver's RNG states (Python, NumPy, torch)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_driver_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


class Snapshots:
    """The trainer's side: take, find the newest complete, restore into the workers."""

    def __init__(self, every: int) -> None:
        from rl_core.single_controller.ray.snapshots import SnapshotStore

        self.every = every
        self.store = SnapshotStore()
        self._driver: dict[int, dict[str, Any]] = {}
        self._calls: list[Any] = []  # the futures of the last snapshot's worker calls

    def _target(self, groups: Mapping[str, Any]) -> Any:
        """The holders of the nodes `groups` run on (started where missing)."""
        return self.store.target(info.node_id for g in groups.values() for info in g.worker_infos)

    def prepare(self, groups: Mapping[str, Any]) -> None:
        """Start the holders for the nodes of ``groups`` and wait for them (a Ray actor
        takes seconds to start: with the run's set-up, not on the first snapshot's path)."""
        self._target(groups)
        self.store.wait_started()

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def take(
        self, step: int, groups: Mapping[str, Any], driver_state: dict[str, Any]
    ) -> dict[str, float]:
        """Snapshot `step` (``groups``: role -> worker group; non-blocking) and keep
        `driver_state`. Metrics: seconds the step was held up, and of the previous snapshot
        one copy's host bytes and the slowest rank's seconds."""
        start = time.perf_counter()
        target = self._target(groups)
        previous = self._calls
        self._calls = [g.begin_snapshot(step, target, role) for role, g in groups.items()]
        self._driver[step] = driver_state
        for old in sorted(self._driver)[:-2]:  # the holders keep two per rank: so do we
            del self._driver[old]
        metrics = {"timing/snapshot_s": time.perf_counter() - start}
        reports = [r for call in previous for r in call.result()]
        errors = [r["error"] for r in reports if "error" in r]
        if errors:
            log.warning("snapshot: a rank's snapshot failed: %s", errors[0])
        done = [r for r in reports if "host_bytes" in r]
        if done:
            metrics["perf/snapshot_host_bytes"] = float(sum(r["host_bytes"] for r in done))
            metrics["timing/snapshot_background_s"] = max(
                r["capture_s"] + r["copy_s"] + r["send_s"] for r in done
            )
        return metrics

    def newest_complete(
        self, world_sizes: Mapping[str, int], alive: Callable[[list[tuple[str, int]]], bool]
    ) -> int | None:
        """The newest complete snapshot's step (``world_sizes``: role -> ranks); parts still
        sent by live ranks (``alive(missing)``) are awaited up to `SETTLE_S`."""
        self._calls = []  # reports of a failed group: not waited for
        deadline = time.monotonic() + SETTLE_S
        for step in sorted(self._driver, reverse=True):
            while True:
                missing = self.store.missing(world_sizes, step)
                if not missing:
                    return step
                if time.monotonic() > deadline or not alive(missing):
                    break
                time.sleep(0.2)
        return None

    def driver_state(self, step: int) -> dict[str, Any]:
        """A copy of the driver's state of snapshot `step` (it may be restored again)."""
        return copy.deepcopy(self._driver[step])

    def restore(self, step: int, groups: Mapping[str, Any]) -> None:
        """Every rank of every trained role loads its part of snapshot `step`."""
        target = self._target(groups)
        for role, group in groups.items():
            group.restore_snapshot(step, target, role)

    def forget_after(self, step: int) -> None:
        """Drop snapshots after `step`: the run went back (the replay writes its own)."""
        for later in [s for s in self._driver if s > step]:
            del self._driver[later]
        self.store.drop_after(step)

    def close(self) -> None:
        self.store.shutdown()

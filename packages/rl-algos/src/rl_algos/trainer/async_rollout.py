"""Asynchronous rollout: a producer thread and a bounded, staleness-aware batch buffer.

With ``async.max_staleness`` = s > 0, batch k may start generating once the rollout's
policy version v has k - v <= s; trained at step k with weights of version k, every sample
is at most s versions old (a sample's version: its oldest token's). s = 0: no thread.
`paused` yields the untrained batches for a checkpoint; `snapshot` does not wait for the
batch in flight (a restore regenerates it). `save_batches` / `load_batches` use no pickle.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl_core.protocol import DataProto

__all__ = ["AsyncRolloutBuffer", "load_batches", "save_batches", "staleness_metrics"]


class AsyncRolloutBuffer:
    """Batches from ``produce(index)`` (a daemon thread) to `get`, at most ``max_staleness``
    versions ahead of ``version()``; ``source_state()`` is read as each batch starts."""

    def __init__(
        self,
        produce: Callable[[int], DataProto],
        version: Callable[[], int],
        max_staleness: int,
        started: int = 0,
        timeout_s: float = 3600.0,
        source_state: Callable[[], Any] | None = None,
    ) -> None:
        if max_staleness < 1:
            raise ValueError(f"max_staleness={max_staleness}: the buffer is for >= 1 (async)")
        self._produce = produce
        self._version = version
        self.max_staleness = max_staleness
        self.started = started
        self.timeout_s = timeout_s
        self._ready: deque[DataProto] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self._paused = 0
        self._stop = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._source_state = source_state
        self._inflight_source: Any = None  # the source's state as the batch in flight began

    def restore(self, batches: list[DataProto]) -> None:
        """Put back batches saved by a checkpoint (before the first `get`)."""
        with self._cond:
            self._ready.extend(batches)
            self.started += len(batches)

    def _may_start(self) -> bool:
        return self.started - self._version() <= self.max_staleness

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and (self._paused or not self._may_start()):
                    self._cond.wait()
                if self._stop:
                    return
                index = self.started
                self.started += 1
                self._busy = True
                if self._source_state is not None:
                    self._inflight_source = copy.deepcopy(self._source_state())
            try:
                batch = self._produce(index)
            except BaseException as exc:  # reported to the trainer by `get`
                with self._cond:
                    self._error, self._busy = exc, False
                    self._cond.notify_all()
                return
            with self._cond:
                self._ready.append(batch)
                self._busy = False
                self._cond.notify_all()

    def get(self) -> DataProto:
        """The oldest generated batch (waits for it); re-raises the producer's error."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="async-rollout", daemon=True)
            self._thread.start()
        with self._cond:
            self._cond.notify_all()
            ok = self._cond.wait_for(
                lambda: self._ready or self._error is not None, timeout=self.timeout_s
            )
            if self._ready:
                return self._ready.popleft()
            if self._error is not None:
                raise RuntimeError(f"async rollout failed: {self._error!r}") from self._error
            if not ok:
                raise TimeoutError(
                    f"async rollout: no batch within {self.timeout_s}s (started {self.started}, "
                    f"policy version {self._version()}, max_staleness {self.max_staleness})"
                )
            raise AssertionError("unreachable")

    def snapshot(self) -> tuple[list[DataProto], Any]:
        """Without waiting: copies of the untrained batches and the data source's state
        after them (before the batch in flight, which a restore regenerates)."""
        if self._source_state is None:
            raise RuntimeError("AsyncRolloutBuffer.snapshot needs the source_state callable")
        with self._cond:
            ready = copy.deepcopy(list(self._ready))
            source = self._inflight_source if self._busy else self._source_state()
            return ready, copy.deepcopy(source)

    def version_changed(self) -> None:
        """Call after a weight sync: the producer may start the next batch."""
        with self._cond:
            self._cond.notify_all()

    @contextlib.contextmanager
    def paused(self) -> Iterator[list[DataProto]]:
        """No batch is being generated inside the block; yields the untrained batches."""
        with self._cond:
            self._paused += 1
            self._cond.wait_for(lambda: not self._busy, timeout=self.timeout_s)
            pending = list(self._ready)
        try:
            yield pending
        finally:
            with self._cond:
                self._paused -= 1
                self._cond.notify_all()

    def stop(self) -> None:
        """Start no further batch (the one being generated finishes or fails); no wait."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def close(self) -> None:
        self.stop()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s)


def staleness_metrics(batch: DataProto, version: int, max_staleness: int) -> dict[str, float]:
    """Staleness histogram/mean/max, partial-rollout share and importance-ratio stats of a
    batch trained with weights of `version`. Raises if a sample is staler than allowed."""
    t = batch.batch
    keys = set(t.keys())  # older TensorDicts refuse `key in td`
    start = int(batch.meta_info.get("rollout_version", version))
    rows = len(batch)
    if "policy_version" in keys:
        oldest = t["policy_version"].clone()
        oldest[oldest < 0] = start  # rows without policy tokens
    else:
        oldest = torch.full((rows,), start, dtype=torch.long)
    staleness = (version - oldest).clamp(min=0)
    worst = int(staleness.max()) if rows else 0
    if worst > max_staleness:
        raise RuntimeError(
            f"a sample of policy version {int(oldest.min())} reached the trainer at version "
            f"{version}: staleness {worst} > async.max_staleness={max_staleness}"
        )
    metrics = {
        "async/staleness/mean": float(staleness.float().mean()) if rows else 0.0,
        "async/staleness/max": float(worst),
        "async/policy_version": float(version),
    }
    for k in range(max_staleness + 1):
        metrics[f"async/staleness/hist_{k}"] = float((staleness == k).float().mean())
    if "rollout_weight_versions" in keys:
        versions = t["rollout_weight_versions"]
        mask = versions >= 0
        newest = versions.masked_fill(~mask, -1).max(dim=1).values
        partial = (newest > t["policy_version"]) & (t["policy_version"] >= 0)
        metrics["async/partial_rollout_frac"] = float(partial.float().mean())
    if "old_log_probs" in keys and "rollout_log_probs" in keys:
        mask = t["response_mask"].bool()
        if mask.any():
            log_ratio = (t["old_log_probs"] - t["rollout_log_probs"])[mask].double()
            ratio = log_ratio.clamp(-20, 20).exp()
            metrics.update(
                {
                    "async/importance_ratio/mean": float(ratio.mean()),
                    "async/importance_ratio/max": float(ratio.max()),
                    "async/importance_ratio/min": float(ratio.min()),
                    "async/importance_ratio/std": float(ratio.std()) if ratio.numel() > 1 else 0.0,
                    "async/log_ratio_abs_mean": float(log_ratio.abs().mean()),
                }
            )
    return metrics


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def save_batches(batches: list[DataProto], directory: Path) -> None:
    """Write untrained batches: tensors (``torch.save`` of plain tensors) + JSON."""
    directory.mkdir(parents=True, exist_ok=True)
    index = []
    for i, batch in enumerate(batches):
        tensors = {k: batch.batch[k].clone() for k in set(batch.batch.keys())}
        torch.save(tensors, directory / f"batch_{i}.pt")
        index.append(
            {
                "non_tensors": {k: _jsonable(v) for k, v in batch.non_tensor_batch.items()},
                "meta_info": _jsonable(batch.meta_info),
            }
        )
    (directory / "batches.json").write_text(json.dumps(index))


def load_batches(directory: Path) -> list[DataProto]:
    """Read what `save_batches` wrote (``weights_only`` tensors: no code runs)."""
    index_file = directory / "batches.json"
    if not index_file.is_file():
        return []
    index = json.loads(index_file.read_text())
    batches = []
    for i, entry in enumerate(index):
        tensors = torch.load(directory / f"batch_{i}.pt", weights_only=True)
        non_tensors = {}
        for key, values in entry["non_tensors"].items():
            array = np.empty(len(values), dtype=object)
            for row, value in enumerate(values):  # element-wise: lists stay lists
                array[row] = value
            non_tensors[key] = array
        batches.append(DataProto.from_dict(tensors, non_tensors, entry["meta_info"]))
    return batches

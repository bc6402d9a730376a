"""Weight sync trainer -> rollout, colocated (in process) or to separate workers (Ray).

Both paths take the trainer's ``export_weights()``: an iterable of (Hugging Face name,
tensor) pairs, consumed lazily so the sender never holds more than a bucket extra.

* Colocated (the hybrid engine: trainer and rollout share a process): `sync_colocated`
  streams the pairs straight into ``engine.update_weights``.
* Separate workers: `push_weights` packs the pairs into size-bounded `WeightBucket`s (one
  flat byte buffer each, so bf16 travels too and Ray's object store moves it zero-copy),
  puts each bucket once into the object store and has every receiving actor load it
  (`receive_weight_bucket` is the actor-side half). At most two buckets are in flight.

Every path has a time-out; a failure raises `WeightSyncError` naming the receiver's rank,
its actor and node, the bucket and the cause.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rl_core.rollout import RolloutEngine
from rl_rollout.backends.weight_files import DEFAULT_BUCKET_BYTES, iter_buckets

__all__ = [
    "SyncStats",
    "WeightBucket",
    "WeightSyncError",
    "push_weights",
    "receive_weight_bucket",
    "sync_colocated",
]

_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
              torch.int32, torch.int8, torch.uint8, torch.bool)
}  # fmt: skip


_ALIGN = 64


class WeightSyncError(RuntimeError):
    """A weight sync failed or timed out; the message names rank, actor, node and cause."""


@dataclass
class SyncStats:
    """What one sync moved and how long it took."""

    tensors: int
    bytes: int
    buckets: int
    seconds: float


@dataclass
class WeightBucket:
    """Named tensors packed into one flat uint8 buffer (numpy: zero-copy through Ray)."""

    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    offsets: list[int]
    data: np.ndarray

    @classmethod
    def pack(cls, pairs: Sequence[tuple[str, Tensor]]) -> WeightBucket:
        names, dtypes, shapes, offsets = [], [], [], []
        total = 0
        for name, tensor in pairs:
            dtype = str(tensor.dtype).removeprefix("torch.")
            if dtype not in _DTYPES:
                raise TypeError(f"weight {name!r} has dtype {tensor.dtype}: not supported")
            names.append(name)
            dtypes.append(dtype)
            shapes.append(tuple(tensor.shape))
            total = -(-total // _ALIGN) * _ALIGN  # every tensor starts aligned
            offsets.append(total)
            total += tensor.numel() * tensor.element_size()
        flat = torch.empty(total, dtype=torch.uint8)
        for (_, tensor), start in zip(pairs, offsets):
            size = tensor.numel() * tensor.element_size()
            src = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            flat[start : start + size].copy_(src)
        return cls(names, dtypes, shapes, offsets, flat.numpy())

    @property
    def nbytes(self) -> int:
        """Payload bytes (without alignment padding)."""
        return sum(
            (int(np.prod(shape)) if shape else 1) * torch.empty((), dtype=_DTYPES[d]).element_size()
            for d, shape in zip(self.dtypes, self.shapes)
        )

    def tensors(self) -> Iterator[tuple[str, Tensor]]:
        """(name, tensor) views into the buffer (read-only when it came from Ray)."""
        with warnings.catch_warnings():  # Ray hands out read-only arrays; we only read
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.from_numpy(self.data)
        for name, dtype, shape, start in zip(self.names, self.dtypes, self.shapes, self.offsets):
            torch_dtype = _DTYPES[dtype]
            numel = int(np.prod(shape)) if shape else 1
            size = numel * torch.empty((), dtype=torch_dtype).element_size()
            yield name, flat[start : start + size].view(torch_dtype).reshape(shape)


async def sync_colocated(
    weights: Iterable[tuple[str, Tensor]], engine: RolloutEngine, timeout_s: float = 600.0
) -> SyncStats:
    """Stream the trainer's exported weights into an engine in the same process."""
    counted = _Counter(weights)
    start = time.perf_counter()
    try:
        await asyncio.wait_for(engine.update_weights(counted), timeout_s)
    except TimeoutError as exc:
        raise WeightSyncError(
            f"colocated weight sync into {type(engine).__name__} timed out after {timeout_s}s "
            f"({counted.tensors} tensors, {counted.bytes} bytes sent so far)"
        ) from exc
    return SyncStats(counted.tensors, counted.bytes, 1, time.perf_counter() - start)


class _Counter:
    """Pass-through iterable that counts tensors and bytes."""

    def __init__(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        self._weights = weights
        self.tensors = 0
        self.bytes = 0

    def __iter__(self) -> Iterator[tuple[str, Tensor]]:
        for name, tensor in self._weights:
            self.tensors += 1
            self.bytes += tensor.numel() * tensor.element_size()
            yield name, tensor


async def receive_weight_bucket(engine: RolloutEngine, bucket: WeightBucket) -> int:
    """Actor-side half of `push_weights`: load one bucket into the engine; return its size."""
    await engine.update_weights(bucket.tensors())
    return len(bucket.names)


def _describe(rank: int, actor: Any) -> str:
    actor_id = getattr(getattr(actor, "_actor_id", None), "hex", lambda: "?")()
    return f"rollout receiver rank {rank} (actor {actor_id})"


def push_weights(
    weights: Iterable[tuple[str, Tensor]],
    receivers: Sequence[Any],
    *,
    method: str = "receive_weight_bucket",
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    timeout_s: float = 600.0,
) -> SyncStats:
    """Send weights to separate rollout actors through Ray's object store, in buckets.

    Each receiver is a Ray actor handle exposing ``method(bucket: WeightBucket)`` (usually
    a thin wrapper around `receive_weight_bucket`). ``timeout_s`` bounds each bucket's
    round trip; a receiver that errors or does not answer in time raises `WeightSyncError`
    naming its rank, actor, node and the cause. Blocking; call from the trainer side.
    """
    import ray

    if not receivers:
        raise ValueError("push_weights: receivers is empty; expected at least one actor")
    start = time.perf_counter()
    pending: deque[tuple[int, str, list[Any]]] = deque()
    tensors = nbytes = buckets = 0

    def wait_oldest() -> None:
        index, first_name, refs = pending.popleft()
        _ready, not_ready = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if not_ready:
            late = [i for i, ref in enumerate(refs) if ref in not_ready]
            who = ", ".join(_describe(i, receivers[i]) for i in late)
            raise WeightSyncError(
                f"weight sync bucket {index} (from {first_name!r}) timed out after "
                f"{timeout_s}s on {who}: the receiver did not finish loading"
            )
        for rank, ref in enumerate(refs):
            try:
                ray.get(ref)
            except Exception as exc:
                cause = getattr(exc, "cause", None) or exc  # a task error wraps the original
                node = getattr(exc, "ip", None)
                where = f" on node {node}" if node else ""
                raise WeightSyncError(
                    f"weight sync bucket {index} (from {first_name!r}) failed on "
                    f"{_describe(rank, receivers[rank])}{where}: {type(cause).__name__}: {cause}"
                ) from exc

    for pairs in iter_buckets(weights, bucket_bytes):
        bucket = WeightBucket.pack(pairs)
        ref = ray.put(bucket)
        refs = [getattr(actor, method).remote(ref) for actor in receivers]
        pending.append((buckets, bucket.names[0], refs))
        tensors += len(bucket.names)
        nbytes += bucket.nbytes
        buckets += 1
        del bucket, ref  # the object store holds it until every receiver has it
        if len(pending) >= 2:
            wait_oldest()
    while pending:
        wait_oldest()
    return SyncStats(tensors, nbytes, buckets, time.perf_counter() - start)

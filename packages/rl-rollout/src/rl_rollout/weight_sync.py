"""Weight sync trainer -> rollout: one session per sync, whole-layer buckets, bounded memory.

Weights come from the trainer's ``export_weights()``: buckets of (Hugging Face name,
tensor) pairs made by rl-core's one bucketing helper (`rl_core.engine.iter_layer_buckets`:
whole layers, so a fused parameter such as qkv or gate_up never straddles two buckets).
Every sync is ONE update session on each rollout engine (one ``update_weights`` call:
vLLM's start -> updates -> finish, SGLang's begin/end_weight_update), however many buckets
it has, and carries the policy ``version`` the engine records per generated token.

* In process (colocated, the hybrid engine): `BucketStream` hands the buckets the trainer
  produces (in its own thread, where the gather collectives run) to the engine's single
  ``update_weights`` call; at most ``max_buckets`` wait in between.
* Separate Ray actors (split placement): `push_weights` packs each bucket into one flat
  byte buffer (`WeightBucket`: bf16 travels too, Ray's object store moves it zero-copy),
  opens a session on every receiver (``begin_weight_update``), sends each bucket once
  (``receive_weight_bucket``; at most two in flight) and closes it
  (``finish_weight_update``). The receiving half is the rollout replica's actor
  (`rl_rollout.manager_replicas`).

Every path has a time-out; a failure raises `WeightSyncError` naming the receiver's rank,
its actor and node, the bucket and the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
import warnings
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rl_core.engine import tensor_nbytes
from rl_core.rollout import RolloutEngine
from rl_rollout.replica_loss import replica_lost

__all__ = [
    "BucketStream",
    "RayPoolSender",
    "SyncStats",
    "WeightBucket",
    "WeightSyncError",
    "flatten_buckets",
    "push_weights",
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
    lost: tuple[int, ...] = ()  # receivers whose process died during the sync (skipped)


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


def flatten_buckets(buckets: Iterable[list[tuple[str, Tensor]]]) -> Iterator[tuple[str, Tensor]]:
    """The (name, tensor) pairs of a bucket stream, in order."""
    for bucket in buckets:
        yield from bucket


class BucketStream:
    """Buckets from a producer thread to one engine ``update_weights`` call, bounded.

    The producer calls `put` for each bucket and `close` at the end (or `fail` with the
    error that stopped it); the consumer iterates the stream's (name, tensor) pairs, which
    blocks until the next bucket arrives (``timeout_s`` at most, then `WeightSyncError`).
    At most ``max_buckets`` buckets wait in between, so memory stays bounded.
    """

    _END = object()

    def __init__(self, max_buckets: int = 2, timeout_s: float = 600.0) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_buckets)
        self.timeout_s = timeout_s
        self.tensors = 0
        self.bytes = 0
        self.buckets = 0

    def put(self, bucket: list[tuple[str, Tensor]]) -> None:
        try:
            self._queue.put(bucket, timeout=self.timeout_s)
        except queue.Full as exc:
            raise WeightSyncError(
                f"weight sync: the rollout engine took no bucket for {self.timeout_s}s "
                f"(bucket {self.buckets}, from {bucket[0][0]!r})"
            ) from exc
        self.buckets += 1
        self.tensors += len(bucket)
        self.bytes += sum(tensor_nbytes(t) for _, t in bucket)

    def close(self) -> None:
        self._queue.put(self._END, timeout=self.timeout_s)

    def fail(self, exc: BaseException) -> None:
        # a consumer that is gone or stuck reports its own time-out
        with contextlib.suppress(queue.Full):
            self._queue.put(exc, timeout=self.timeout_s)

    def __iter__(self) -> Iterator[tuple[str, Tensor]]:
        while True:
            try:
                item = self._queue.get(timeout=self.timeout_s)
            except queue.Empty as exc:
                raise WeightSyncError(
                    f"weight sync: no bucket arrived for {self.timeout_s}s after bucket "
                    f"{self.buckets} (the trainer stalled while exporting weights?)"
                ) from exc
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise WeightSyncError(f"weight sync: the sender failed: {item!r}") from item
            yield from item


async def sync_colocated(
    weights: Iterable[tuple[str, Tensor]],
    engine: RolloutEngine,
    *,
    version: int | None = None,
    timeout_s: float = 600.0,
) -> SyncStats:
    """Stream the trainer's exported weights into an engine in the same process: one
    ``update_weights`` session."""
    counted = _Counter(weights)
    start = time.perf_counter()
    try:
        await asyncio.wait_for(engine.update_weights(counted, version=version), timeout_s)
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
            self.bytes += tensor_nbytes(tensor)
            yield name, tensor


def _describe(rank: int, actor: Any) -> str:
    actor_id = getattr(getattr(actor, "_actor_id", None), "hex", lambda: "?")()
    return f"rollout receiver rank {rank} (actor {actor_id})"


def _wait_all(
    refs: list[Any],
    receivers: Sequence[Any],
    what: str,
    timeout_s: float,
    lost: set[int] | None = None,
) -> None:
    """Every receiver's step (``refs[i]``: receiver i's task, None where it is already
    lost) within `timeout_s`, else `WeightSyncError` naming the receiver. With `lost` (a
    set), a receiver whose process died is added to it instead; losing all of them raises."""
    import ray

    sent = [ref for ref in refs if ref is not None]
    _ready, not_ready = ray.wait(sent, num_returns=len(sent), timeout=timeout_s)
    if not_ready:
        late = [i for i, ref in enumerate(refs) if ref is not None and ref in not_ready]
        who = ", ".join(_describe(i, receivers[i]) for i in late)
        raise WeightSyncError(f"weight sync {what} timed out after {timeout_s}s on {who}")
    for rank, ref in enumerate(refs):
        if ref is None:
            continue
        try:
            ray.get(ref)
        except Exception as exc:
            if lost is not None and replica_lost(exc):
                lost.add(rank)
                continue
            cause = getattr(exc, "cause", None) or exc  # a task error wraps the original
            node = getattr(exc, "ip", None)
            where = f" on node {node}" if node else ""
            raise WeightSyncError(
                f"weight sync {what} failed on {_describe(rank, receivers[rank])}{where}: "
                f"{type(cause).__name__}: {cause}"
            ) from exc
    if lost and len(lost) == len(receivers):
        who = ", ".join(_describe(i, r) for i, r in enumerate(receivers))
        raise WeightSyncError(f"weight sync {what}: every rollout receiver was lost ({who})")


def push_weights(
    buckets: Iterable[list[tuple[str, Tensor]]],
    receivers: Sequence[Any],
    *,
    version: int | None = None,
    timeout_s: float = 600.0,
    skip_lost: bool = False,
) -> SyncStats:
    """Send weight buckets to rollout replicas in other Ray actors: one session per sync.

    ``buckets`` come from `iter_layer_buckets` (a trainer's ``export_weights``); each
    receiver is a replica actor handle with ``begin_weight_update(version)``,
    ``receive_weight_bucket(bucket)`` and ``finish_weight_update()``. ``timeout_s`` bounds
    each step; a receiver that errors or does not answer in time raises `WeightSyncError`
    naming its rank, actor, node and the cause. ``skip_lost`` (rollout failover): a
    receiver whose process dies during the sync is skipped from then on and listed in
    `SyncStats.lost` (the pool's failover drops or replaces it at its next request); the
    sync fails only when every receiver is lost. Blocking; call from the trainer side.
    """
    import ray

    if not receivers:
        raise ValueError("push_weights: receivers is empty; expected at least one actor")
    start = time.perf_counter()
    lost: set[int] | None = set() if skip_lost else None

    def each(call: Any) -> list[Any]:  # one task per receiver not lost (None: skipped)
        return [None if lost and i in lost else call(r) for i, r in enumerate(receivers)]

    def wait(refs: list[Any], what: str) -> None:
        _wait_all(refs, receivers, what, timeout_s, lost)

    wait(each(lambda r: r.begin_weight_update.remote(version, timeout_s)), "session start")
    pending: deque[tuple[list[Any], str]] = deque()
    tensors = nbytes = count = 0
    try:
        for pairs in buckets:
            bucket = WeightBucket.pack(pairs)
            ref = ray.put(bucket)
            what = f"bucket {count} (from {bucket.names[0]!r})"
            pending.append((each(lambda r, ref=ref: r.receive_weight_bucket.remote(ref)), what))
            tensors += len(bucket.names)
            nbytes += bucket.nbytes
            count += 1
            del bucket, ref  # the object store holds it until every receiver has it
            if len(pending) >= 2:
                wait(*pending.popleft())
        while pending:
            wait(*pending.popleft())
    except BaseException:
        each(lambda r: r.finish_weight_update.remote(abort=True))  # the engines serve again
        raise
    wait(each(lambda r: r.finish_weight_update.remote()), "session end")
    seconds = time.perf_counter() - start
    return SyncStats(tensors, nbytes, count, seconds, tuple(sorted(lost or ())))


@dataclass
class RayPoolSender:
    """`push_weights` to a rollout pool's replica actors, as a picklable callable: the
    driver hands it to the trainer's rank 0, which calls ``sender(buckets, version)``."""

    receivers: list[Any]
    timeout_s: float = 600.0
    skip_lost: bool = False  # rollout failover: a receiver that dies mid-sync is skipped

    def __call__(self, buckets: Iterable[list[tuple[str, Tensor]]], version: int) -> SyncStats:
        return push_weights(
            buckets,
            self.receivers,
            version=version,
            timeout_s=self.timeout_s,
            skip_lost=self.skip_lost,
        )

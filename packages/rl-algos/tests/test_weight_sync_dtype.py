"""Weight-sync buckets leave the trainer in the rollout engine's dtype: a bf16 rollout is
sent bf16 tensors, not the fp32 master weights (twice the bytes on a GPU that already
holds the rollout)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rl_algos.trainer.workers import ActorRolloutWorker


class _RecordingEngine:
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def export_weights(self, bucket_bytes: int, dtype=None):
        self.calls.append({"bucket_bytes": bucket_bytes, "dtype": dtype})
        master = torch.ones(4, dtype=torch.float32)
        yield [("w", master if dtype is None else master.to(dtype))]


def _worker(rollout_dtype: str | None) -> ActorRolloutWorker:
    worker = ActorRolloutWorker.__new__(ActorRolloutWorker)
    rollout = (
        None
        if rollout_dtype is None
        else SimpleNamespace(rollout=SimpleNamespace(dtype=rollout_dtype))
    )
    worker.config = SimpleNamespace(rollout=rollout, weight_bucket_bytes=1 << 20)
    worker.engine = _RecordingEngine()
    worker._worker_info = SimpleNamespace(platform="cpu", rank=0)  # what `Worker` reads
    return worker


@pytest.mark.parametrize(
    ("rollout_dtype", "sent"),
    [
        ("bfloat16", torch.bfloat16),
        ("float16", torch.float16),
        ("float32", torch.float32),
        ("auto", torch.float32),
    ],  # fmt: skip  ("auto" on the CPU platform: float32)
)
def test_colocated_sync_buckets_are_in_the_rollout_dtype(rollout_dtype, sent):
    worker = _worker(rollout_dtype)
    tensors = [t for bucket in worker._buckets() for _, t in bucket]
    assert worker.engine.calls == [{"bucket_bytes": 1 << 20, "dtype": sent}]
    assert all(t.dtype == sent for t in tensors)


def test_pushed_buckets_follow_the_senders_dtype():
    """Split placement: no rollout in this process; the sender says which dtype its
    engines hold, and without one the weights go as trained."""
    worker = _worker(None)
    got: list = []

    class Sender:
        dtype = torch.bfloat16

        def __call__(self, buckets, version):
            got.extend(t for bucket in buckets for _, t in bucket)

    worker.push_weights(Sender(), 3)
    assert worker.engine.calls[-1]["dtype"] == torch.bfloat16
    assert [t.dtype for t in got] == [torch.bfloat16]
    list(worker._buckets())
    assert worker.engine.calls[-1]["dtype"] is None

"""Trainer side of vLLM's NCCL weight transfer for a split rollout pool (GPU only).

`VLLMNcclSender` is what `AgentLoopGenerator.weight_sender` returns for a ``vllm`` pool
started with ``engine_kwargs={"weight_transfer": "nccl"}``: the driver hands it to the
trainer's rank 0, which calls ``sender(buckets, version)`` every sync. The first call builds
the NCCL group: the trainer is rank 0 (vLLM's ``NCCLWeightTransferEngine.trainer_init``),
replica i's TP workers are ranks ``1 + i * tp ...``. Each sync is one session per replica
(``begin_nccl_update`` -> per whole-layer bucket: the replicas' ``receive_nccl_bucket``
concurrently with the trainer's packed broadcast -> ``finish_nccl_update``).

Written against vLLM 0.32/0.33's static trainer API (``trainer_init`` /
``trainer_send_weights``; later versions moved to a ``TrainerWeightTransferEngine``):
pin vLLM with it. Unverified here (no GPU); CPU runs use `RayPoolSender`.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from rl_core.single_controller.host import find_free_port
from rl_rollout.weight_sync import SyncStats, WeightSyncError, _wait_all

__all__ = ["VLLMNcclSender"]

_GROUPS: dict[tuple[str, int], Any] = {}  # (address, port) -> the trainer's communicator


@dataclass
class VLLMNcclSender:
    """Broadcast weight buckets from the trainer's rank 0 to a vLLM pool over NCCL."""

    receivers: list[Any]
    tensor_parallel_size: int
    timeout_s: float = 600.0
    master_address: str = field(default_factory=lambda: socket.gethostbyname(socket.gethostname()))
    master_port: int = field(default_factory=find_free_port)

    def _group(self) -> Any:
        key = (self.master_address, self.master_port)
        if key not in _GROUPS:
            from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

            world = 1 + len(self.receivers) * self.tensor_parallel_size
            joins = [
                r.call.remote(
                    "init_nccl_weight_transfer",
                    self.master_address,
                    self.master_port,
                    1 + i * self.tensor_parallel_size,
                    world,
                )
                for i, r in enumerate(self.receivers)
            ]
            _GROUPS[key] = NCCLWeightTransferEngine.trainer_init(
                {"master_address": self.master_address, "master_port": self.master_port,
                 "world_size": world}
            )  # fmt: skip
            _wait_all(joins, self.receivers, "NCCL group setup", self.timeout_s)
        return _GROUPS[key]

    def __call__(self, buckets: Iterable[list[tuple[str, Tensor]]], version: int) -> SyncStats:
        import time

        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        group = self._group()
        start = time.perf_counter()
        rs = self.receivers
        _wait_all([r.call.remote("begin_nccl_update") for r in rs], rs, "start", self.timeout_s)
        tensors = nbytes = count = 0
        try:
            for bucket in buckets:
                names = [n for n, _ in bucket]
                dtypes = [str(t.dtype).removeprefix("torch.") for _, t in bucket]
                shapes = [list(t.shape) for _, t in bucket]
                refs = [r.call.remote("receive_nccl_bucket", names, dtypes, shapes) for r in rs]
                NCCLWeightTransferEngine.trainer_send_weights(
                    iter(bucket), {"group": group, "packed": True}
                )
                _wait_all(refs, rs, f"bucket {count} (from {names[0]!r})", self.timeout_s)
                tensors += len(bucket)
                nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
                count += 1
        except BaseException as exc:
            for r in rs:
                r.call.remote("finish_nccl_update", None)
            raise WeightSyncError(f"NCCL weight sync failed: {exc}") from exc
        _wait_all(
            [r.call.remote("finish_nccl_update", version) for r in rs], rs, "finish", self.timeout_s
        )
        return SyncStats(tensors, nbytes, count, time.perf_counter() - start)

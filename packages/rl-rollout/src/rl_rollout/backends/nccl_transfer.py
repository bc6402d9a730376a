"""Trainer side of the NCCL weight broadcast into a split rollout pool (GPU only).

`NcclPoolSender` is what `AgentLoopGenerator.weight_sender` returns for a ``vllm`` or
``sglang`` pool started with ``engine_kwargs={"weight_transfer": "nccl"}``: the driver
hands it to the trainer's rank 0, which calls ``sender(buckets, version)`` every sync.

The first call builds one NCCL group: the trainer is rank 0, replica i's TP workers are
ranks ``1 + i * tp ...``. Every sync is one session per replica: ``begin_nccl_update``,
then per whole-layer bucket the replicas' ``receive_nccl_bucket(names, dtypes, shapes)``
concurrently with the trainer's broadcast, then ``finish_nccl_update(version)``. Both
engines implement that receiver protocol on their own RL APIs:

* ``vllm``: the weight-transfer engine (``init_weight_transfer_engine``,
  ``start_weight_update`` / ``update_weights`` / ``finish_weight_update``); the trainer
  uses vLLM 0.32/0.33's static ``NCCLWeightTransferEngine.trainer_init`` /
  ``trainer_send_weights`` (packed). Later vLLM versions moved these: pin vLLM with it.
* ``sglang``: ``init_weights_update_group`` and ``update_weights_from_distributed``
  inside ``begin_weight_update`` / ``end_weight_update``; the trainer joins the group
  through SGLang's own ``init_custom_process_group`` (so both sides build it the same
  way) and broadcasts every tensor of a bucket from rank 0, in the bucket's order.

Unverified here (no GPU); CPU runs use `rl_rollout.weight_sync.RayPoolSender`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from torch import Tensor

from rl_core.single_controller.host import find_free_port
from rl_rollout.weight_sync import SyncStats, WeightSyncError, _wait_all

__all__ = ["GROUP_NAME", "NcclPoolSender"]

GROUP_NAME = "rl_weight_sync"
_GROUPS: dict[tuple[str, int], Any] = {}  # (address, port) -> the trainer's communicator


def _trainer_group(backend: str, address: str, port: int, world: int, timeout_s: float) -> Any:
    """Join the broadcast group as rank 0 (the receivers join concurrently)."""
    if backend == "vllm":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        info = {"master_address": address, "master_port": port, "world_size": world}
        return NCCLWeightTransferEngine.trainer_init(info)
    from sglang.srt.utils import init_custom_process_group

    return init_custom_process_group(
        backend="nccl",
        init_method=f"tcp://{address}:{port}",
        timeout=timedelta(seconds=timeout_s),
        world_size=world,
        rank=0,
        group_name=GROUP_NAME,
    )


def _broadcast(backend: str, group: Any, bucket: list[tuple[str, Tensor]]) -> None:
    """Send one bucket from rank 0, the way the backend's receiver reads it."""
    if backend == "vllm":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        NCCLWeightTransferEngine.trainer_send_weights(
            iter(bucket), {"group": group, "packed": True}
        )
        return
    import torch.distributed as dist

    works = [dist.broadcast(t.contiguous(), src=0, group=group, async_op=True) for _, t in bucket]
    for work in works:
        work.wait()


@dataclass
class NcclPoolSender:
    """Broadcast weight buckets from the trainer's rank 0 to a vLLM or SGLang pool."""

    receivers: list[Any]
    tensor_parallel_size: int
    backend: Literal["vllm", "sglang"]
    timeout_s: float = 600.0
    master_address: str = field(default_factory=lambda: socket.gethostbyname(socket.gethostname()))
    master_port: int = field(default_factory=find_free_port)

    def __post_init__(self) -> None:
        if self.backend not in ("vllm", "sglang"):
            raise ValueError(
                f"NcclPoolSender: backend {self.backend!r} has no NCCL weight receiver; "
                "expected 'vllm' or 'sglang'"
            )

    def _group(self) -> Any:
        key = (self.master_address, self.master_port)
        if key not in _GROUPS:
            tp = self.tensor_parallel_size
            world = 1 + len(self.receivers) * tp
            joins = [
                r.call.remote(
                    "init_nccl_weight_transfer", self.master_address, self.master_port,
                    1 + i * tp, world,
                )
                for i, r in enumerate(self.receivers)
            ]  # fmt: skip
            _GROUPS[key] = _trainer_group(
                self.backend, self.master_address, self.master_port, world, self.timeout_s
            )
            _wait_all(joins, self.receivers, "NCCL group setup", self.timeout_s)
        return _GROUPS[key]

    def __call__(self, buckets: Iterable[list[tuple[str, Tensor]]], version: int) -> SyncStats:
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
                _broadcast(self.backend, group, bucket)
                _wait_all(refs, rs, f"bucket {count} (from {names[0]!r})", self.timeout_s)
                tensors += len(bucket)
                nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
                count += 1
        except BaseException as exc:
            for r in rs:
                r.call.remote("finish_nccl_update", None)
            raise WeightSyncError(f"NCCL weight sync ({self.backend}) failed: {exc}") from exc
        _wait_all(
            [r.call.remote("finish_nccl_update", version) for r in rs], rs, "finish", self.timeout_s
        )
        return SyncStats(tensors, nbytes, count, time.perf_counter() - start)

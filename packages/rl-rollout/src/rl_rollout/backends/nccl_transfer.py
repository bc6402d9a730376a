"""Trainer side of the NCCL weight broadcast into a split rollout pool (GPU only).

`NcclPoolSender` is what `AgentLoopGenerator.weight_sender` returns for a ``vllm`` or
``sglang`` pool started with ``engine_kwargs={"weight_transfer": "nccl"}``: the driver
hands it to the trainer's rank 0, which calls ``sender(buckets, version)`` every sync.

The first call builds one NCCL group: the trainer is rank 0, replica i's TP workers are
ranks ``1 + i * tp ...``. Every sync is one session per replica: ``begin_nccl_update``,
then per whole-layer bucket the replicas' ``receive_nccl_bucket(names, dtypes, shapes)``
concurrently with the trainer's broadcast, then ``finish_nccl_update(version)``. Both
engines implement that receiver protocol on their own RL APIs:

* ``vllm`` (pinned to 0.32): the engine side is the weight-transfer engine
  (``init_weight_transfer_engine``, ``start_weight_update`` / ``update_weights`` /
  ``finish_weight_update``); the trainer side is vLLM 0.32's own trainer engine,
  ``WeightTransferTrainerFactory.trainer_init(NCCLTrainerInitInfo(...), client=...,
  source=...)`` and ``send_weights()`` per bucket (packed broadcast). The ``client`` is
  `_PoolClient` (vLLM's ``VLLMWeightSyncClient`` protocol over our replica actors: it
  gives each replica its rank offset and leaves the session to the sender), the ``source``
  a `WeightSource` holding the current bucket. vLLM 0.33 changed this trainer API
  (``WeightSource.metadata`` became a property, ``iter_full``): moving the pin means
  revisiting `_bucket_source` (the API-surface test fails first).
* ``sglang`` (pinned to 0.5.23): ``init_weights_update_group`` and
  ``update_weights_from_distributed`` inside ``begin_weight_update`` /
  ``end_weight_update``; the trainer joins the group through SGLang's own
  ``init_custom_process_group`` (so both sides build it the same way) and broadcasts every
  tensor of a bucket from rank 0, in the bucket's order.

Unverified here (no GPU); CPU runs use `rl_rollout.weight_sync.RayPoolSender`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cache
from typing import Any, Literal

import torch
from torch import Tensor

from rl_core.platform import get_platform
from rl_core.single_controller.host import find_free_port
from rl_rollout.weight_sync import SyncStats, WeightSyncError, _wait_all

__all__ = ["GROUP_NAME", "NcclPoolSender"]

GROUP_NAME = "rl_weight_sync"
# (address, port) -> the trainer's side: vLLM's trainer engine or SGLang's process group
_GROUPS: dict[tuple[str, int], Any] = {}
# keys of vLLM's worker init payload that are wire parameters (both sides must agree)
VLLM_WIRE_KEYS = ("packed", "packed_buffer_size_bytes", "packed_num_buffers")


@dataclass
class _PoolClient:
    """vLLM 0.32's ``VLLMWeightSyncClient`` (a structural protocol) over the replica actors.

    ``init_weight_transfer_engine`` gives replica i the rank offset ``1 + i * tp`` (vLLM's
    trainer engine assumes a single replica at offset 1) and the trainer's wire parameters;
    ``update_weights`` has every replica receive one bucket (vLLM runs it beside the
    broadcast). ``start_weight_update`` / ``finish_weight_update`` do nothing: the sender
    opens one session per sync around all buckets (``begin_nccl_update`` /
    ``finish_nccl_update``), so layers are rebuilt once per sync.
    """

    receivers: list[Any]
    tensor_parallel_size: int
    timeout_s: float
    bucket: int = 0

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        wire = {k: init_info[k] for k in VLLM_WIRE_KEYS if k in init_info}
        tp = self.tensor_parallel_size
        refs = [
            r.call.remote(
                "init_nccl_weight_transfer", init_info["master_address"],
                init_info["master_port"], 1 + i * tp, init_info["world_size"], wire,
            )
            for i, r in enumerate(self.receivers)
        ]  # fmt: skip
        _wait_all(refs, self.receivers, "NCCL group setup", self.timeout_s)

    def start_weight_update(self) -> None:
        return None

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        if isinstance(update_info, list):
            raise ValueError("NCCL weight sync (vllm): expected one update_info per bucket")
        names = update_info["names"]
        dtypes, shapes = update_info["dtype_names"], update_info["shapes"]
        rs = self.receivers
        refs = [r.call.remote("receive_nccl_bucket", names, dtypes, shapes) for r in rs]
        what = f"bucket {self.bucket} (from {names[0]!r})" if names else f"bucket {self.bucket}"
        _wait_all(refs, rs, what, self.timeout_s)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        return None


@cache
def _bucket_source_class() -> type:
    """vLLM's ``WeightSource`` over one bucket at a time (vLLM imported on first use)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class BucketSource(WeightSource):
        """The bucket being sent: vLLM's trainer engine reads its metadata, then
        iterates it (and checks that both agree) while broadcasting."""

        def __init__(self) -> None:
            self.bucket: list[tuple[str, Tensor]] = []

        def metadata(self) -> list[Any]:
            return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self.bucket]

        def __iter__(self):
            return iter(self.bucket)

    return BucketSource


def _vllm_trainer(client: _PoolClient, address: str, port: int, world: int) -> Any:
    """vLLM's NCCL trainer engine as rank 0; the replicas join through ``client``."""
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    info = NCCLTrainerInitInfo(
        master_address=address, master_port=port, world_size=world, packed=True, rank=0
    )
    source = _bucket_source_class()()
    return WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)


def _vllm_send(trainer: Any, bucket: list[tuple[str, Tensor]]) -> None:
    """One bucket through vLLM's trainer engine (the replicas receive it meanwhile)."""
    trainer.source.bucket = bucket
    try:
        trainer.send_weights()
    finally:
        trainer.source.bucket = []


def _sglang_group(address: str, port: int, world: int, timeout_s: float) -> Any:
    """Join SGLang's broadcast group as rank 0 (the receivers join concurrently)."""
    from sglang.srt.utils import init_custom_process_group

    return init_custom_process_group(
        backend="nccl",
        init_method=f"tcp://{address}:{port}",
        timeout=timedelta(seconds=timeout_s),
        world_size=world,
        rank=0,
        group_name=GROUP_NAME,
    )


def _sglang_broadcast(group: Any, bucket: list[tuple[str, Tensor]]) -> None:
    """Send one bucket from rank 0, tensor by tensor, the way SGLang receives it."""
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
    device: torch.device | None = None
    """Where the buckets go before the broadcast (None: the platform's current device). An
    engine may export host tensors (megatron does); NCCL refuses them."""

    def __post_init__(self) -> None:
        if self.backend not in ("vllm", "sglang"):
            raise ValueError(
                f"NcclPoolSender: backend {self.backend!r} has no NCCL weight receiver; "
                "expected 'vllm' or 'sglang'"
            )

    def _trainer_side(self) -> tuple[Any, _PoolClient]:
        """The group, built on first use: vLLM's trainer engine or SGLang's group."""
        key = (self.master_address, self.master_port)
        if key not in _GROUPS:
            tp = self.tensor_parallel_size
            world = 1 + len(self.receivers) * tp
            client = _PoolClient(list(self.receivers), tp, self.timeout_s)
            if self.backend == "vllm":
                side = _vllm_trainer(client, self.master_address, self.master_port, world)
            else:
                joins = [
                    r.call.remote(
                        "init_nccl_weight_transfer", self.master_address, self.master_port,
                        1 + i * tp, world,
                    )
                    for i, r in enumerate(self.receivers)
                ]  # fmt: skip
                side = _sglang_group(self.master_address, self.master_port, world, self.timeout_s)
                _wait_all(joins, self.receivers, "NCCL group setup", self.timeout_s)
            _GROUPS[key] = (side, client)
        return _GROUPS[key]

    def _send(self, side: Any, client: _PoolClient, bucket: list[tuple[str, Tensor]]) -> None:
        device = self.device or get_platform().device()
        bucket = [(name, t if t.device == device else t.to(device)) for name, t in bucket]
        if self.backend == "vllm":
            _vllm_send(side, bucket)  # vLLM runs client.update_weights beside the broadcast
            return
        rs = self.receivers
        names = [n for n, _ in bucket]
        dtypes = [str(t.dtype).removeprefix("torch.") for _, t in bucket]
        shapes = [list(t.shape) for _, t in bucket]
        refs = [r.call.remote("receive_nccl_bucket", names, dtypes, shapes) for r in rs]
        _sglang_broadcast(side, bucket)
        _wait_all(refs, rs, f"bucket {client.bucket} (from {names[0]!r})", self.timeout_s)

    def __call__(self, buckets: Iterable[list[tuple[str, Tensor]]], version: int) -> SyncStats:
        side, client = self._trainer_side()
        start = time.perf_counter()
        rs = self.receivers
        _wait_all([r.call.remote("begin_nccl_update") for r in rs], rs, "start", self.timeout_s)
        tensors = nbytes = count = 0
        try:
            for bucket in buckets:
                client.bucket = count
                self._send(side, client, bucket)
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

"""`EngineBase`: the half of a training engine that does not depend on how the model is
parallelised, shared by the fsdp and megatron engines.

It joins the process group on the platform's device, keeps the step counter and the
offloaded flag, builds the AdamW optimizer and LR schedule from `OptimConfig`, and checks
what every public method checks first (onloaded, trainable, a valid temperature). A
subclass supplies the model, the forward/backward, the gradient norm, checkpoints and
``_move`` (where parameters and optimizer state go on offload/onload).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from rl_core.engine import (
    EngineConfig,
    TrainEngine,
    local_micro_batch_count,
)
from rl_core.protocol import DataProto
from rl_engines.distributed import (
    all_reduce,
    device_and_backend,
    ensure_process_group,
    local_device,
)
from rl_engines.hf_model import check_model_path

__all__ = ["EngineBase", "init_optimizer_state"]


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Materialise AdamW state as a fresh optimizer would have it (zeros, step 0), unless
    it exists already.

    Sharded checkpointing needs the state to exist: a zero-lr step, then zeroing every
    state tensor, keeps the first real step identical to a fresh optimizer's.
    """
    if optimizer.state:
        return
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    lrs = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, Tensor):
                value.zero_()


class EngineBase(TrainEngine):
    """Process group, device, step counter, optimizer and offload state of an engine.

    ``__init__`` validates the config, checks the model path, picks this rank's device and
    joins the default process group (``_prepare_platform`` runs just before, for engines
    that patch libraries first). Subclasses call it first, then build their model and
    `_build_optimizer`.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config.validate()
        check_model_path(config.model.path)
        self.device_type, backend = device_and_backend()
        self._prepare_platform()
        self._device = local_device()
        ensure_process_group(backend, config.timeout_s)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.value_model = config.model.value_head
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self._step = 0
        self._offloaded = False

    def _prepare_platform(self) -> None:
        """Hook run after the device type is known and before the process group exists."""

    def _build_optimizer(self, params: Sequence[Tensor]) -> None:
        """AdamW over ``params`` and the LR schedule, from ``config.optim``; none for an
        ``inference_only`` engine."""
        if self.config.inference_only:
            return
        opt = self.config.optim
        self.optimizer = torch.optim.AdamW(
            list(params), lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, opt.lr_factor)

    # ---- layout -------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def global_step(self) -> int:
        return self._step

    # ---- checks -------------------------------------------------------------------
    def _require_onloaded(self, what: str) -> None:
        if self._offloaded:
            raise RuntimeError(f"{what} called while the engine is offloaded: call onload() first")

    def _require_trainable(self, what: str) -> None:
        if self.optimizer is None:
            raise RuntimeError(
                f"rank {self.rank}: {what} on an engine built with "
                "EngineConfig.inference_only=True (no optimizer): build it with "
                "inference_only=False to train or checkpoint it"
            )

    def _temperature(self, batch: DataProto, temperature: float | None) -> float:
        """``temperature``, else the batch's ``meta_info["temperature"]``, else 1.0."""
        if temperature is None:
            temperature = batch.meta_info.get("temperature", 1.0)
        if not isinstance(temperature, (int, float)) or not (
            math.isfinite(temperature) and temperature > 0
        ):
            raise ValueError(f"temperature={temperature!r} is invalid: expected a number > 0")
        return float(temperature)

    def _num_micro_batches(self, batch: DataProto, train: bool) -> int:
        """The largest local micro-batch count over all ranks (every rank runs as many)."""
        cfg = self.config.micro_batch if train else self.config.infer_micro_batch_config
        count = torch.tensor([local_micro_batch_count(batch, cfg)], device=self.device)
        return int(all_reduce(count, dist.ReduceOp.MAX, "the micro-batch count").item())

    # ---- memory -------------------------------------------------------------------
    def offload(self) -> None:
        if self._offloaded:
            return
        self._move("cpu")
        self._offloaded = True

    def onload(self) -> None:
        if not self._offloaded:
            return
        self._move(self.device)
        self._offloaded = False

    @abstractmethod
    def _move(self, device: torch.device | str) -> None:
        """Move parameters and optimizer state to ``device`` (offload: "cpu")."""

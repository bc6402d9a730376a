"""`EngineBase`: the half of a training engine that does not depend on how the model is
parallelised, shared by the fsdp and megatron engines.

It joins the process group on the platform's device, keeps the step counter and the
offloaded flag, builds the AdamW optimizer and LR schedule from `OptimConfig`, and checks
what every public method checks first (onloaded, trainable, a valid temperature, the
batch's keys, the loss function's result). It ends every training step the same way
(clip, step or skip, ``on_nan``, the metrics) and writes and checks the same checkpoint
metadata and per-rank training state. A subclass supplies the model, the
forward/backward, the gradient norm, how shards are saved and loaded, and ``_move``
(where parameters and optimizer state go on offload/onload).
"""

from __future__ import annotations

import math
import random
from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from rl_core.engine import (
    INFER_KEYS,
    TRAIN_KEYS,
    EngineConfig,
    LossContext,
    LossFn,
    TrainEngine,
    check_batch,
    check_outputs,
    local_micro_batch_count,
)
from rl_core.engine.snapshot import SnapshotView
from rl_core.protocol import DataProto
from rl_engines.checkpointing import rng_state, set_rng_state
from rl_engines.distributed import (
    all_reduce,
    device_and_backend,
    ensure_process_group,
    local_device,
)
from rl_engines.hf_model import check_model_path

__all__ = ["RESERVED_METRICS", "EngineBase", "init_optimizer_state"]

RESERVED_METRICS = (
    "loss",
    "grad_norm",
    "lr",
    "num_tokens",
    "num_seqs",
    "num_micro_batches",
    "skipped",
)


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Materialise AdamW state as a fresh optimizer would have it (zeros, step 0) for every
    trainable parameter that has none yet (all of them before the first step; afterwards
    those that never got a gradient, e.g. a value head trained only by PPO).

    Sharded checkpointing needs the state to exist: a zero-lr step over only those
    parameters (the others hold no gradient, so the step skips them), then zeroing their
    state, keeps their first real step identical to a fresh optimizer's.
    """
    params = [
        p
        for group in optimizer.param_groups
        for p in group["params"]
        if p.requires_grad and not optimizer.state.get(p)
    ]
    if not params:
        return
    optimizer.zero_grad(set_to_none=True)
    for p in params:
        p.grad = torch.zeros_like(p)
    lrs = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    for p in params:
        for value in optimizer.state[p].values():
            if isinstance(value, Tensor):
                value.zero_()


# Device types whose fused AdamW kernel takes our parameters (DTensors included). One
# kernel for the whole update instead of a dozen per parameter: on an H200 the step of a
# 0.5B model is launch-bound without it.
FUSED_ADAMW_DEVICES = frozenset({"cuda", "xpu", "cpu"})


def fused_adamw_supported(params: Sequence[Tensor]) -> bool:
    """Whether AdamW can run fused over ``params``: floating point, all on one device type
    in `FUSED_ADAMW_DEVICES`."""
    types = {p.device.type for p in params}
    return (
        len(types) == 1
        and types <= FUSED_ADAMW_DEVICES
        and all(torch.is_floating_point(p) for p in params)
    )


def _local(tensor: Tensor) -> Tensor:
    """This rank's part of a tensor (a DTensor's local shard), detached."""
    to_local = getattr(tensor, "to_local", None)
    return (to_local() if to_local is not None else tensor).detach()


class EngineBase(TrainEngine):
    """Process group, device, step counter, optimizer and offload state of an engine.

    ``__init__`` validates the config, checks the model path, picks this rank's device and
    joins the default process group (``_prepare_platform`` runs just before, for engines
    that patch libraries first). Subclasses call it first, then build their model and
    `_build_optimizer`. `infer_batch` checks its input and calls the subclass's ``_infer``;
    ``train_batch`` uses `_begin_train_batch` and `_finish_train_batch` around its own
    forward/backward; ``save``/``load`` use `_refuse_nonfinite`, `_train_state` and
    `_restore_train_state`.
    """

    engine_name: ClassVar[str]  # the checkpoint's ``meta.json`` "engine"
    supports_snapshots: ClassVar[bool] = True  # `snapshot_view` / `restore_snapshot`
    #: AdamW's fused kernel where the device has one (`fused_adamw_supported`)
    fused_adamw: ClassVar[bool] = True

    def __init__(self, config: EngineConfig) -> None:
        self.config = config.validate()
        check_model_path(config.model.path)
        self.device_type, backend = device_and_backend()
        self._prepare_platform()
        self._device = local_device()
        ensure_process_group(backend, config.timeout_s)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.value_model = config.model.value_head
        #: outputs a custom model (``ModelConfig.builder``) offers; None: by `value_model`
        self.allowed_outputs: tuple[str, ...] | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        #: the AdamW kernel choice (``fused``, ``foreach``) `_build_optimizer` made
        self._optimizer_impl: dict[str, bool | None] | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self._step = 0
        self._offloaded = False

    def _seed_rngs(self) -> None:
        """Seed this process's torch, NumPy and Python RNGs with ``seed + rank`` (the end
        of ``__init__``): a run with the same seed draws the same numbers, and its RNG
        states (in checkpoints and snapshots) are the same."""
        seed = self.config.seed + self.rank
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)

    def _prepare_platform(self) -> None:
        """Hook run after the device type is known and before the process group exists."""

    def _after_optimizer_step(self) -> None:
        """Hook run right after each optimizer step (e.g. main weights into the model)."""

    def _build_optimizer(self, params: Sequence[Tensor]) -> None:
        """AdamW over ``params`` and the LR schedule, from ``config.optim``; none for an
        ``inference_only`` engine."""
        if self.config.inference_only:
            return
        opt = self.config.optim
        params = list(params)
        fused = self.fused_adamw and fused_adamw_supported(params)
        self._optimizer_impl = {"fused": fused or None, "foreach": None}
        self.optimizer = torch.optim.AdamW(
            params,
            lr=opt.lr,
            betas=opt.betas,
            eps=opt.eps,
            weight_decay=opt.weight_decay,
            **self._optimizer_impl,
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

    def _check_outputs(self, outputs: Sequence[str]) -> tuple[str, ...]:
        """The requested output kinds, checked against what the model computes."""
        if self.allowed_outputs is None:
            return check_outputs(outputs, self.value_model)
        outputs = (outputs,) if isinstance(outputs, str) else tuple(outputs)
        bad = [o for o in outputs if o not in self.allowed_outputs]
        if bad or not outputs:
            raise ValueError(
                f"outputs={outputs!r} is invalid for this model: expected some of "
                f"{self.allowed_outputs}"
            )
        return outputs

    def _num_micro_batches(self, batch: DataProto, train: bool) -> int:
        """The largest local micro-batch count over all ranks (every rank runs as many)."""
        cfg = self.config.micro_batch if train else self.config.infer_micro_batch_config
        count = torch.tensor([local_micro_batch_count(batch, cfg)], device=self.device)
        return int(all_reduce(count, dist.ReduceOp.MAX, "the micro-batch count").item())

    # ---- training -----------------------------------------------------------------
    def _begin_train_batch(
        self, batch: DataProto, outputs: Sequence[str] | None
    ) -> tuple[tuple[str, ...], float, Tensor]:
        """The checks of ``train_batch``; returns the outputs to compute (default: the
        model's kind), the temperature and this rank's float64 [response tokens, sequences]
        on the engine's device."""
        self._require_onloaded("train_batch")
        self._require_trainable("train_batch")
        check_batch(batch, TRAIN_KEYS)
        default = ("values",) if self.value_model else ("log_probs",)
        outputs = self._check_outputs(outputs or default)
        counts = torch.tensor(
            [float(batch.batch["response_mask"].sum()), float(len(batch))],
            dtype=torch.float64,
            device=self.device,
        )
        return outputs, self._temperature(batch, None), counts

    def _finish_train_batch(
        self,
        reduced: Tensor,
        keys: Sequence[str],
        grad_norm: float,
        params: Iterable[Tensor],
        counts: tuple[int, int, int],
        extra_metrics: dict[str, float],
    ) -> dict[str, float]:
        """The end of ``train_batch``, given the summed gradients of ``params`` and their
        global norm: clip to ``optim.grad_clip`` and step optimizer and LR schedule when
        the loss and the norm are finite (gradients are dropped either way); raise when
        not and ``on_nan="raise"``; return the step's metrics.

        ``reduced``: the global [loss sum, non-finite loss count, *metric sums in ``keys``
        order]; ``counts``: (tokens, sequences, micro-batches) of the step.
        """
        finite = reduced[1].item() == 0 and math.isfinite(grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        if finite:
            max_norm = self.config.optim.grad_clip
            if max_norm:
                total = torch.tensor(grad_norm, dtype=torch.float32, device=self.device)
                torch.nn.utils.clip_grads_with_norm_(list(params), max_norm, total, foreach=True)
            self.optimizer.step()
            self._after_optimizer_step()
            self.scheduler.step()
            self._step += 1
        self.optimizer.zero_grad(set_to_none=True)
        if not finite and self.config.on_nan == "raise":
            raise FloatingPointError(
                f"rank {self.rank}: non-finite {'loss' if reduced[1].item() else 'gradient norm'} "
                f"at step {self._step} (loss={reduced[0].item()}, grad_norm={grad_norm}); the "
                "optimizer step was not taken (EngineConfig.on_nan='skip' drops such steps)"
            )
        num_tokens, num_seqs, num_micro = counts
        result = {
            "loss": reduced[0].item(),
            "grad_norm": grad_norm,
            "lr": lr,
            "num_tokens": float(num_tokens),
            "num_seqs": float(num_seqs),
            "num_micro_batches": float(num_micro),
            "skipped": 0.0 if finite else 1.0,
        }
        result.update({key: reduced[2 + i].item() for i, key in enumerate(keys)})
        result.update(extra_metrics)
        return result

    def _call_loss(
        self, loss_fn: LossFn, out: dict[str, Tensor], micro_batch: DataProto, ctx: LossContext
    ) -> tuple[Tensor, dict[str, float]]:
        """``loss_fn``'s (loss, metrics), checked against the loss contract: a scalar loss
        that requires grad, no metric named like one of the engine's own."""
        result = loss_fn(out, micro_batch, ctx)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError(
                f"loss_fn returned {type(result).__name__}: expected a tuple (loss tensor, "
                "metrics dict)"
            )
        loss, metrics = result
        if not isinstance(loss, Tensor) or loss.dim() != 0 or not loss.requires_grad:
            raise TypeError(
                f"loss_fn returned loss {loss!r}: expected a scalar tensor that requires grad"
            )
        clash = sorted(set(metrics) & set(RESERVED_METRICS))
        if clash:
            raise ValueError(f"loss_fn metrics {clash} clash with the engine's own metrics")
        return loss, metrics

    # ---- inference ----------------------------------------------------------------
    @torch.no_grad()
    def infer_batch(
        self,
        batch: DataProto,
        outputs: Sequence[str] = ("log_probs",),
        temperature: float | None = None,
    ) -> DataProto:
        self._require_onloaded("infer_batch")
        check_batch(batch, INFER_KEYS)
        outputs = self._check_outputs(outputs)
        temperature = self._temperature(batch, temperature)
        num_micro = self._num_micro_batches(batch, train=False)
        tensors = self._infer(batch, outputs, temperature, num_micro)
        return DataProto.from_dict(tensors=tensors, meta_info={"temperature": temperature})

    @abstractmethod
    def _infer(
        self, batch: DataProto, outputs: tuple[str, ...], temperature: float, num_micro: int
    ) -> dict[str, Tensor]:
        """``infer_batch`` after its checks: the outputs, CPU tensors [B, R] in row order,
        from ``num_micro`` micro-batches (the same count on every rank)."""

    # ---- checkpoints --------------------------------------------------------------
    def _refuse_nonfinite(self, bad: Tensor, path: str) -> None:
        """Refuse (on every rank) to save ``path`` when any rank counts non-finite
        parameters in its ``bad``."""
        if all_reduce(bad, dist.ReduceOp.SUM, "the parameter finiteness check").item():
            raise FloatingPointError(
                f"rank {self.rank}: refusing to save {path!r}: parameters hold non-finite values"
            )

    def _checkpoint_meta(self, **fields: Any) -> dict[str, Any]:
        """``meta.json`` of a checkpoint: engine, step, model kind and the engine's
        ``fields``."""
        return {
            "engine": self.engine_name,
            "step": self._step,
            "value_model": self.value_model,
            **fields,
        }

    def _train_state(self) -> dict[str, Any]:
        """This rank's step, LR schedule and RNG states, for its checkpoint file."""
        return {"step": self._step, "scheduler": self.scheduler.state_dict(), "rng": rng_state()}

    def _keep_optimizer_impl(self) -> None:
        """After loading param groups (a checkpoint, a snapshot), keep this engine's own
        kernel choice: a checkpoint written on another device type may name a fused
        kernel this one lacks."""
        if self._optimizer_impl is not None and self.optimizer is not None:
            for group in self.optimizer.param_groups:
                group.update(self._optimizer_impl)

    def _restore_train_state(self, path: str, state: dict[str, Any], meta: dict[str, Any]) -> None:
        """Check the checkpoint ``path``'s ``meta`` fits this engine and restore the
        `_train_state` it saved (RNG states only where it has them)."""
        if meta.get("engine") != self.engine_name:
            raise ValueError(
                f"checkpoint {path!r} was written by engine {meta.get('engine')!r}, not "
                f"{self.engine_name!r}"
            )
        if bool(meta.get("value_model")) != self.value_model:
            raise ValueError(
                f"checkpoint {path!r} has value_model={meta.get('value_model')}, this engine "
                f"value_model={self.value_model}"
            )
        self._keep_optimizer_impl()
        self._step = int(state["step"])
        self.scheduler.load_state_dict(state["scheduler"])
        if "rng" in state:
            set_rng_state(state["rng"])

    # ---- in-memory snapshots ----------------------------------------------------------
    def _snapshot_params(self) -> list[tuple[str, Tensor]]:
        """(name, tensor) of the parameters this rank trains, as the optimizer steps them
        (sharded tensors are fine: their local shard is taken)."""
        raise NotImplementedError(f"{type(self).__name__} does not name its snapshot parameters")

    def _after_snapshot_restore(self) -> None:
        """Hook run after `restore_snapshot` wrote the tensors (e.g. main weights into the
        model)."""

    def _snapshot_tensors(self) -> dict[str, Tensor]:
        """This rank's live training tensors by name: the trainable parameters' local
        shards, then per optimizer parameter its state (and the parameter itself when it
        is a copy of its own, e.g. fp32 main weights kept apart from the model's)."""
        init_optimizer_state(self.optimizer)  # the state a first step makes, made now
        tensors: dict[str, Tensor] = {}
        storages: set[int] = set()

        def add(name: str, tensor: Tensor) -> None:
            local = _local(tensor)
            tensors[name] = local
            storages.add(local.untyped_storage().data_ptr())

        for name, param in self._snapshot_params():
            add(f"param.{name}", param)
        for g, group in enumerate(self.optimizer.param_groups):
            for i, param in enumerate(group["params"]):
                if _local(param).untyped_storage().data_ptr() not in storages:
                    add(f"optim.{g}.{i}.param", param)
                for key, value in sorted(self.optimizer.state.get(param, {}).items()):
                    if isinstance(value, Tensor):
                        add(f"optim.{g}.{i}.{key}", value)
        return tensors

    def snapshot_view(self) -> SnapshotView:
        self._require_onloaded("snapshot_view")
        self._require_trainable("snapshot_view")
        tensors = self._snapshot_tensors()
        state = self._train_state()
        state["param_groups"] = [
            {k: v for k, v in group.items() if k != "params"}
            for group in self.optimizer.param_groups
        ]
        return SnapshotView(state, tensors)

    def restore_snapshot(self, state: dict[str, Any], tensors: Mapping[str, Tensor]) -> None:
        self._require_onloaded("restore_snapshot")
        self._require_trainable("restore_snapshot")
        live = self._snapshot_tensors()
        for name, target in live.items():
            given = tensors.get(name)
            if given is None or given.shape != target.shape or given.dtype != target.dtype:
                found = "missing" if given is None else f"{given.dtype} {tuple(given.shape)}"
                raise ValueError(
                    f"rank {self.rank}: snapshot tensor {name!r} is {found}; expected "
                    f"{target.dtype} {tuple(target.shape)} (a snapshot of another model or "
                    "layout)"
                )
        extra = sorted(set(tensors) - set(live))
        if extra:
            raise ValueError(
                f"rank {self.rank}: snapshot tensors {extra[:3]} are not this engine's"
            )
        with torch.no_grad():
            for name, target in live.items():
                target.copy_(tensors[name])
        for group, saved in zip(self.optimizer.param_groups, state["param_groups"], strict=True):
            group.update(saved)
        self._keep_optimizer_impl()
        self._step = int(state["step"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        self._after_snapshot_restore()

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

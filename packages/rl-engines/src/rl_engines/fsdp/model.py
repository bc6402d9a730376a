"""Shard a Hugging Face model (built by `rl_engines.hf_model`) with FSDP2 (`fully_shard`)
on a DeviceMesh."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from rl_core.engine import ParallelConfig

__all__ = ["build_device_mesh", "shard_model"]


def build_device_mesh(parallel: ParallelConfig, device_type: str, world_size: int) -> DeviceMesh:
    """1-D ``("dp_shard",)`` mesh (FSDP) or 2-D ``("dp_replicate", "dp_shard")`` (HSDP)."""
    if parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1:
        raise ValueError(
            f"ParallelConfig: tensor_parallel_size={parallel.tensor_parallel_size}, "
            f"pipeline_parallel_size={parallel.pipeline_parallel_size}: the fsdp engine "
            "supports only 1 (use the megatron engine for TP/PP)"
        )
    if parallel.expert_parallel_size != 1:
        raise ValueError(
            f"ParallelConfig.expert_parallel_size={parallel.expert_parallel_size}: the fsdp "
            "engine supports only 1"
        )
    replicate, shard = parallel.dp_layout(world_size)
    if replicate == 1:
        return init_device_mesh(device_type, (shard,), mesh_dim_names=("dp_shard",))
    return init_device_mesh(
        device_type, (replicate, shard), mesh_dim_names=("dp_replicate", "dp_shard")
    )


def _layer_classes(model: nn.Module) -> set[str]:
    names = set(getattr(model, "_no_split_modules", None) or ())
    if not names:
        raise ValueError(
            f"{type(model).__name__} declares no _no_split_modules: the fsdp engine cannot tell "
            "which modules are its transformer layers"
        )
    return names


def shard_model(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    compute_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    cpu_offload: bool,
    activation_checkpointing: bool,
    reshard_after_forward: bool | None,
    device: torch.device,
) -> nn.Module:
    """Apply FSDP2 per transformer layer and at the root; gradients are *summed* over ranks.

    `reshard_after_forward` applies to the layers (None: only when the ``dp_shard`` mesh
    dimension has more than one rank; with one rank resharding saves no communication and
    costs a copy per layer in backward). The root keeps FSDP's default (not resharded: it
    is needed first in backward).

    A single rank gets one FSDP unit, the root, unless it offloads to the CPU or asks to
    reshard after forward (both save memory layer by layer): there is nothing to shard,
    gather or overlap, and per-layer units only add hooks (on an H200 they made a 0.5B
    model's step launch-bound). Memory is the same: such a rank reshards no layer before
    backward anyway.
    """
    if reshard_after_forward is None:
        reshard_after_forward = mesh["dp_shard"].size() > 1
    if activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    param_dtype = None if compute_dtype == next(model.parameters()).dtype else compute_dtype
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    offload: OffloadPolicy = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    layer_classes = _layer_classes(model)
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    if mesh.size() == 1 and not cpu_offload and not reshard_after_forward:
        layers = []  # one unit (see above)
    for layer in layers:
        fully_shard(
            layer,
            mesh=mesh,
            mp_policy=mp_policy,
            offload_policy=offload,
            reshard_after_forward=reshard_after_forward,
        )
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, offload_policy=offload)
    if not cpu_offload and device.type != "cpu" and not next(model.parameters()).is_meta:
        model.to(device)  # a meta model is materialised on the device by its loader
    # The loss contract sums gradients over data-parallel ranks (losses carry the global
    # normalisation), so FSDP must not average them.
    # Plain SUM collectives (no AVG/PREMUL_SUM, which gloo lacks), divided by nothing.
    for module in (*layers, model):
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)
    return model

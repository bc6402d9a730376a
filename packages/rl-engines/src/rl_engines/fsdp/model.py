"""Build a Hugging Face model and shard it with FSDP2 (`fully_shard`) on a DeviceMesh.

Causal LMs load through ``AutoModelForCausalLM``; vision-language models (a config with a
``vision_config``, e.g. Qwen2-VL, Qwen2.5-VL) through ``AutoModelForImageTextToText``, their
vision tower frozen when ``freeze_vision_tower`` is set. Value models (``value_head=True``) load
through ``AutoModelForTokenClassification`` with ``num_labels=1``: the backbone plus a
``score`` linear head giving one scalar per token; from a causal-LM checkpoint the head is
initialised from the engine seed (identically on every rank), and its dropout is set to 0
so training is deterministic.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from rl_core.engine import ModelConfig, ParallelConfig
from rl_core.platform import get_platform
from rl_engines.fsdp.multimodal import freeze_vision_tower

__all__ = [
    "build_device_mesh",
    "build_hf_model",
    "resolve_attn_implementation",
    "resolve_compute_dtype",
    "shard_model",
]


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def resolve_compute_dtype(config: ModelConfig) -> torch.dtype:
    """``compute_dtype`` with "auto" resolved by the platform: bfloat16 on accelerators,
    float32 on CPU."""
    if config.compute_dtype == "auto":
        return get_platform().auto_dtype
    return _dtype(config.compute_dtype)


def resolve_attn_implementation(attn_implementation: str) -> str:
    """A Hugging Face ``attn_implementation`` with "auto" resolved by the platform's
    preference."""
    if attn_implementation == "auto":
        return get_platform().preferred_attention()
    return attn_implementation


def _hf_config(config: ModelConfig) -> Any:
    from transformers import AutoConfig

    if config.path is not None:
        if not os.path.isdir(config.path):
            raise FileNotFoundError(
                f"ModelConfig.path={config.path!r} does not exist or is not a directory: "
                "expected a local Hugging Face model directory (config.json + weights)"
            )
        hf_config = AutoConfig.from_pretrained(
            config.path, trust_remote_code=config.trust_remote_code
        )
    else:
        fields = dict(config.config or {})
        model_type = fields.pop("model_type")
        hf_config = AutoConfig.for_model(model_type, **fields)
    for key, value in config.override_config.items():
        setattr(hf_config, key, value)
    if config.value_head:
        hf_config.num_labels = 1
        hf_config.classifier_dropout = 0.0
    hf_config.use_cache = False
    return hf_config


def build_hf_model(config: ModelConfig, seed: int, attn_implementation: str = "auto") -> nn.Module:
    """The unsharded model on CPU in ``config.dtype`` (weights from ``path`` or random)."""
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForTokenClassification,
    )

    hf_config = _hf_config(config)
    if config.value_head:
        auto = AutoModelForTokenClassification
    elif getattr(hf_config, "vision_config", None) is not None:
        auto = AutoModelForImageTextToText
    else:
        auto = AutoModelForCausalLM
    kwargs = {
        "dtype": _dtype(config.dtype),
        "attn_implementation": resolve_attn_implementation(attn_implementation),
        "trust_remote_code": config.trust_remote_code,
    }
    torch.manual_seed(seed)  # random init (config models, fresh value heads) equal on all ranks
    if config.path is not None:
        model = auto.from_pretrained(config.path, config=hf_config, **kwargs)
    else:
        model = auto.from_config(hf_config, **kwargs)
    if config.value_head and getattr(model, "score", None) is None:
        raise ValueError(
            f"ModelConfig.value_head=True but {type(model).__name__} has no 'score' head: "
            "expected a model with a token-classification head"
        )
    if config.freeze_vision_tower:
        freeze_vision_tower(model)
    return model


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
    for layer in layers:
        fully_shard(
            layer,
            mesh=mesh,
            mp_policy=mp_policy,
            offload_policy=offload,
            reshard_after_forward=reshard_after_forward,
        )
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, offload_policy=offload)
    if not cpu_offload and device.type != "cpu":
        model.to(device)
    # The loss contract sums gradients over data-parallel ranks (losses carry the global
    # normalisation), so FSDP must not average them.
    # Plain SUM collectives (no AVG/PREMUL_SUM, which gloo lacks), divided by nothing.
    for module in (*layers, model):
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)
    return model

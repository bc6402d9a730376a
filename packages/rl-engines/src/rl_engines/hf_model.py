"""Hugging Face models as both engines load them: config, dtype, attention kernel, weights.

Causal LMs load through ``AutoModelForCausalLM``; vision-language models (a config with a
``vision_config``, e.g. Qwen2-VL, Qwen2.5-VL) through ``AutoModelForImageTextToText``, their
vision tower frozen when ``freeze_vision_tower`` is set. Value models (``value_head=True``) load
through ``AutoModelForTokenClassification`` with ``num_labels=1``: the backbone plus a
``score`` linear head giving one scalar per token; from a causal-LM checkpoint the head is
initialised from the engine seed (identically on every rank), and its dropout is set to 0
so training is deterministic.

The fsdp engine shards the model built here (`rl_engines.fsdp.model`); the megatron engine
copies its weights into megatron-core modules (`rl_engines.megatron.weights`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from rl_core.engine import ModelConfig
from rl_core.platform import get_platform

__all__ = [
    "EAGER_INIT_ENV",
    "build_custom_model",
    "build_hf_model",
    "check_model_path",
    "freeze_vision_tower",
    "hf_model_config",
    "resolve_attn_implementation",
    "resolve_compute_dtype",
    "streamed_checkpoint_tensors",
    "torch_dtype",
    "vision_tower",
]


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a `ModelConfig` dtype name ("float32", "bfloat16", "float16")."""
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def check_model_path(path: str | None) -> None:
    """Refuse a ``ModelConfig.path`` that is set but is not a directory."""
    if path is not None and not os.path.isdir(path):
        raise FileNotFoundError(
            f"ModelConfig.path={path!r} does not exist or is not a directory: expected a "
            "local Hugging Face model directory (config.json + weights)"
        )


def resolve_compute_dtype(config: ModelConfig) -> torch.dtype:
    """``compute_dtype`` with "auto" resolved by the platform: bfloat16 on accelerators,
    float32 on CPU."""
    if config.compute_dtype == "auto":
        return get_platform().auto_dtype
    return torch_dtype(config.compute_dtype)


def resolve_attn_implementation(attn_implementation: str) -> str:
    """A Hugging Face ``attn_implementation`` with "auto" resolved by the platform's
    preference."""
    if attn_implementation == "auto":
        return get_platform().preferred_attention()
    return attn_implementation


def vision_tower(model: nn.Module) -> nn.Module | None:
    """The vision encoder of a Hugging Face VLM (``model.model.visual`` or ``model.visual``)."""
    for owner in (getattr(model, "model", None), model):
        tower = getattr(owner, "visual", None) if owner is not None else None
        if isinstance(tower, nn.Module):
            return tower
    return None


def freeze_vision_tower(model: nn.Module) -> None:
    """Stop gradients into the vision encoder; raise if the model has none."""
    tower = vision_tower(model)
    if tower is None:
        raise ValueError(
            f"ModelConfig.freeze_vision_tower=True but {type(model).__name__} has no vision "
            "tower ('visual' module): expected a vision-language model such as Qwen2.5-VL"
        )
    tower.requires_grad_(False)


def hf_model_config(config: ModelConfig) -> Any:
    """The Hugging Face config `build_hf_model` builds ``config``'s model from."""
    from transformers import AutoConfig

    if config.path is not None:
        check_model_path(config.path)
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

    hf_config = hf_model_config(config)
    if config.value_head:
        auto = AutoModelForTokenClassification
    elif getattr(hf_config, "vision_config", None) is not None:
        auto = AutoModelForImageTextToText
    else:
        auto = AutoModelForCausalLM
    kwargs = {
        "dtype": torch_dtype(config.dtype),
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


def build_custom_model(config: ModelConfig, seed: int) -> nn.Module:
    """The model of a registered builder (``ModelConfig.builder``, `rl_core.engine.models`),
    unsharded on CPU, its random parts initialised from ``seed`` on every rank alike."""
    from rl_core.engine import MODEL_BUILDERS, RLModel

    builder = MODEL_BUILDERS.get(str(config.builder))
    torch.manual_seed(seed)
    model = builder(config, seed)
    if not isinstance(model, nn.Module) or not isinstance(model, RLModel):
        raise TypeError(
            f"model builder {config.builder!r} returned {type(model).__name__}: expected an "
            "nn.Module with rl_output_kinds and forward(micro_batch, outputs, temperature)"
        )
    return model


# Set to 1, the engines build the whole Hugging Face model on every rank and shard it
# (the start-up path before per-rank loading; for comparisons, `benchmarks/init_memory.py`).
EAGER_INIT_ENV = "RL_ENGINES_EAGER_INIT"


@contextmanager
def streamed_checkpoint_tensors(sink: Callable[[str, Tensor], None]) -> Iterator[None]:
    """While active, Hugging Face's ``from_pretrained`` hands each checkpoint tensor (after
    its key renames and conversions, in the model's dtype) to ``sink(name, tensor)`` one at
    a time and gives the model a meta tensor, marked as loaded, in its place. Parameters
    missing from the checkpoint and buffers are initialised by Hugging Face as usual."""
    import transformers.core_model_loading as loading

    original = getattr(loading, "set_param_for_module", None)
    if original is None:
        raise RuntimeError(
            "transformers.core_model_loading.set_param_for_module is missing: this "
            "transformers version is not supported by the per-rank loader (set "
            f"{EAGER_INIT_ENV}=1 to build the whole model per rank)"
        )

    def capture(model: Any, target_name: str, value: Tensor, *args: Any, **kwargs: Any) -> None:
        if isinstance(value, DTensor):
            raise RuntimeError(f"{target_name}: unexpected DTensor from the checkpoint loader")
        sink(target_name, value)
        original(model, target_name, torch.empty_like(value, device="meta"), *args, **kwargs)

    previous_async = os.environ.get("HF_DEACTIVATE_ASYNC_LOAD")
    os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = "1"  # one tensor at a time, not a prefetch pool
    loading.set_param_for_module = capture
    try:
        yield
    finally:
        loading.set_param_for_module = original
        if previous_async is None:
            os.environ.pop("HF_DEACTIVATE_ASYNC_LOAD", None)
        else:
            os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = previous_async

"""The VLA policy as a training engine's model: the ``vla`` builder of ``rl.models``.

``ModelConfig(path=<VLM dir>, builder="vla", builder_options={...})`` makes the fsdp engine
build a `VLAPolicy` (`rl_core.engine.models`): the VLM with its action head and value head,
sharded per layer like any Hugging Face model. ``builder_options`` are the `vla` section's
policy fields plus the environment's action space (``action_low``, ``action_high``,
``max_chunk``): `rl_algos.trainer.vla_episodes.vla_policy_options`.
"""

from __future__ import annotations

from typing import Any

import torch

from rl_core.env import ActionSpec
from rl_multimodal.vla.policy import VLAPolicy, VLAPolicyConfig

__all__ = ["add_lora_adapters", "build_vla_policy"]


def build_vla_policy(config: Any, seed: int) -> VLAPolicy:
    """A `VLAPolicy` from ``config.path`` (the VLM) in ``config.dtype``; its new heads are
    initialised from `seed` (the engine seeds torch before calling)."""
    from transformers import AutoModelForImageTextToText

    from rl_multimodal.vlm.processor import load_processor

    options = dict(config.builder_options)
    try:
        spec = ActionSpec(
            options.pop("action_low"), options.pop("action_high"), options.pop("max_chunk", 1)
        )
    except KeyError as exc:
        raise ValueError(
            f"ModelConfig.builder_options: missing {exc}, expected the env's action space"
        ) from None
    model = AutoModelForImageTextToText.from_pretrained(
        config.path, dtype=getattr(torch, config.dtype)
    )
    policy = VLAPolicy(model, load_processor(config.path), spec, VLAPolicyConfig(**options))
    if getattr(config, "lora", None) is not None:
        add_lora_adapters(policy, config.lora)
    return policy.to(getattr(torch, config.dtype))


def add_lora_adapters(policy: VLAPolicy, lora: Any) -> None:
    """LoRA adapters (PEFT, injected in place) on the policy's language model: its base
    weights and ``lm_head`` are frozen and only the adapters train there; the action and
    value heads, the image adapter and (unless ``freeze_vision``) the vision tower train as
    without LoRA. The adapter names follow PEFT (``<m>.base_layer.weight``,
    ``<m>.lora_A.default.weight``), which the engine merges on export and weight sync."""
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as exc:
        raise ImportError(
            "model.lora is set for a VLA policy but PEFT is not installed: "
            "pip install 'rl-multimodal[lora]'"
        ) from exc
    targets = list(lora.target_modules)
    language_model = policy.model.model.language_model
    inject_adapter_in_model(
        LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            target_modules="all-linear" if targets == ["all-linear"] else targets,
            lora_dropout=lora.dropout,
            bias="none",
        ),
        language_model,
    )
    adapters = 0
    for name, param in language_model.named_parameters():
        is_adapter = ".lora_A." in name or ".lora_B." in name
        param.requires_grad_(is_adapter)
        adapters += is_adapter
    if not adapters:
        raise ValueError(
            f"model.lora.target_modules={targets}: no layer of the policy's language model "
            "matched (expected names such as q_proj, v_proj)"
        )
    policy.model.lm_head.requires_grad_(False)
    policy.has_lora_adapters = True

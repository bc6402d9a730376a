"""The VLA policy as a training engine's model: the ``vla`` builder of ``rl.models``.

``ModelConfig(path=<VLM dir>, builder="vla", builder_options=vla_policy_options(cfg))``
makes the fsdp engine build a `VLAPolicy`, sharded per layer like any Hugging Face model.
"""

from __future__ import annotations

from typing import Any

import torch

from rl_multimodal.vla.policy import VLAPolicy, split_options

__all__ = ["add_lora_adapters", "build_vla_policy"]


def build_vla_policy(config: Any, seed: int) -> VLAPolicy:
    """A `VLAPolicy` from ``config.path`` (the VLM) in ``config.dtype``; its new heads are
    initialised from `seed` (the engine seeds torch before calling)."""
    from transformers import AutoModelForImageTextToText

    from rl_multimodal.vlm.processor import load_processor

    spec, policy_config = split_options(config.builder_options, "ModelConfig.builder_options")
    dtype = getattr(torch, config.dtype)
    model = AutoModelForImageTextToText.from_pretrained(config.path, dtype=dtype)
    policy = VLAPolicy(model, load_processor(config.path), spec, policy_config)
    if getattr(config, "lora", None) is not None:
        add_lora_adapters(policy, config.lora)
    return policy.to(dtype)


def add_lora_adapters(policy: VLAPolicy, lora: Any) -> None:
    """LoRA adapters (PEFT, in place, PEFT's names) on the policy's language model, whose base
    weights and ``lm_head`` are frozen; the rest trains as without LoRA (package README)."""
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

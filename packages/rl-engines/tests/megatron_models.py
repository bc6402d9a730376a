"""Tiny random models for the megatron engine tests (a MoE beside the suite's dense ones)."""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from rl_core.testing.train_engine import save_tiny_model, tiny_hf_config

# Qwen3-MoE over the suite's tiny dense config: 4 experts, top-2, renormalised, QK norm
MOE_FIELDS: dict[str, Any] = {
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "head_dim": 16,
    "router_aux_loss_coef": 0.0,
}


def tiny_moe_config(**overrides: Any) -> dict[str, Any]:
    """Qwen3-MoE: 4 experts, top-2, renormalised, QK norm, untied embeddings."""
    return tiny_hf_config("qwen3_moe", **{**MOE_FIELDS, **overrides})


def save_tiny_moe(directory: str, value_head: bool = False, seed: int = 0) -> str:
    save_tiny_model(directory, "qwen3_moe", value_head, seed, **MOE_FIELDS)
    # transformers' default grouped-GEMM experts reject float64, which the suite's
    # reference forward uses; the eager experts compute the same function
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        saved = json.load(f)
    saved["experts_implementation"] = "eager"
    with open(path, "w") as f:
        json.dump(saved, f, indent=2)
    return directory


def save_model(directory: str, model_type: str, value_head: bool = False) -> str:
    if model_type == "qwen3_moe":
        return save_tiny_moe(directory, value_head)
    return save_tiny_model(directory, model_type, value_head=value_head)


def save_llama4(directory: str) -> str:
    """The suite's tiny Llama with 4 layers (PP=2 with 2 virtual stages: a layer each)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = tiny_hf_config("llama", num_hidden_layers=4)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory

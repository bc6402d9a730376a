"""Rank-side helpers for the sharded-initialisation tests: tiny checkpoints of every model
source the fsdp engine loads, and one rank's view of an engine built eagerly (whole model,
then shard) or per rank (`rl_engines.fsdp.sharded_load`)."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from rl_core.engine import build_engine
from rl_core.testing.train_engine import (
    engine_config,
    make_rl_batch,
    pg_loss,
    save_tiny_model,
    tiny_hf_config,
    value_loss,
)
from rl_engines.hf_model import EAGER_INIT_ENV


def save_moe_model(directory: str) -> str:
    """A tiny Qwen3-MoE (its experts are fused into one tensor on load: a key conversion)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = tiny_hf_config(
        "qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16
    )
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


def save_vlm(directory: str) -> str:
    """A tiny Qwen2-VL as rl-multimodal's ``tiny-random-vlm:qwen2_vl`` shapes it (its
    checkpoint keys are renamed on load: ``model.layers`` -> ``model.language_model.layers``)."""
    from transformers import AutoModelForImageTextToText, Qwen2VLConfig

    text = tiny_hf_config("qwen2", tie_word_embeddings=False)
    text.pop("model_type")
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": 1e4,
        "mrope_section": [2, 3, 3],
    }
    vision = {"depth": 2, "num_heads": 2, "embed_dim": 32, "hidden_size": 64, "mlp_ratio": 2}
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=500,
        video_token_id=501,
        vision_start_token_id=502,
        vision_end_token_id=503,
    )
    torch.manual_seed(2)
    AutoModelForImageTextToText.from_config(config).save_pretrained(directory)
    return directory


def save_sources(root: str) -> dict[str, dict[str, Any]]:
    """Engine options per model source (all tiny), keyed by a case name."""
    llama = save_tiny_model(os.path.join(root, "llama"), "llama")
    return {
        "tied_qwen2": {"model": {"path": save_tiny_model(os.path.join(root, "qwen2"), "qwen2")}},
        "value_head_from_causal": {"model": {"path": llama, "value_head": True}},
        "lora": {"model": {"path": llama, "lora": {"rank": 4, "target_modules": ["all-linear"]}}},
        "config_only": {"model": {"path": None, "config": tiny_hf_config("llama")}},
        "moe": {"model": {"path": save_moe_model(os.path.join(root, "moe"))}},
        "vlm": {
            "model": {"path": save_vlm(os.path.join(root, "vlm")), "freeze_vision_tower": True}
        },
    }


def _full_state(engine) -> dict[str, torch.Tensor]:
    """Every parameter (gathered) and buffer (persistent or not) of the engine's model."""
    out = {}
    for name, param in engine.model.named_parameters():
        full = param.full_tensor() if isinstance(param, DTensor) else param
        out[name] = full.detach().cpu().clone()
    for name, buffer in engine.model.named_buffers():
        out["buffer:" + name] = buffer.detach().cpu().clone()
    return out


def build_both_ways(options: dict[str, Any]) -> dict[str, Any]:
    """Full state, one training step's metrics and the updated state, for the eager and
    the per-rank build of the same engine config (rank 0 returns the states)."""
    result: dict[str, Any] = {}
    for mode in ("eager", "sharded"):
        if mode == "eager":
            os.environ[EAGER_INIT_ENV] = "1"
        else:
            os.environ.pop(EAGER_INIT_ENV, None)
        config = engine_config(None, options, seed=7)
        engine = build_engine("fsdp", config)
        state = _full_state(engine)
        value = bool(options["model"].get("value_head"))
        batch = make_rl_batch(num_seqs=4).chunk(engine.dp_size)[engine.dp_rank]
        outputs = ("values",) if value else ("log_probs",)
        metrics = engine.train_batch(batch, value_loss if value else pg_loss, outputs)
        after = _full_state(engine)
        engine.close()
        rank0 = engine.dp_rank == 0
        result[mode] = {
            "trainable": sorted(n for n, p in engine.model.named_parameters() if p.requires_grad),
            "state": state if rank0 else None,
            "after": after if rank0 else None,
            "loss": metrics["loss"],
            "grad_norm": metrics["grad_norm"],
        }
    os.environ.pop(EAGER_INIT_ENV, None)
    return result

"""The routing that vLLM and SGLang report (router replay), as `GenerationOutput.routed_experts`.

* vLLM 0.32 (engine argument ``enable_return_routed_experts``): the final output of each
  sample carries ``routed_experts``, a numpy array [prompt + generated - 1, layers, top_k].
* SGLang 0.5.23 (server argument ``enable_return_routed_experts``, request argument
  ``return_routed_experts``): ``meta_info["routed_experts"]`` holds the same rows as base64
  of little-endian int32 (or a tensor, depending on the output path), flattened.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["MOE_EXPERT_FIELDS", "check_moe_model", "decode_routed_experts"]

# Hugging Face config fields that give a mixture-of-experts model's routed experts per layer.
MOE_EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def check_moe_model(model_path: str) -> None:
    """Refuse `RolloutConfig.return_routed_experts` for a model whose ``config.json`` names no
    routed experts (a dense model)."""
    with open(os.path.join(model_path, "config.json")) as f:
        config = json.load(f)
    config = config.get("text_config", config)
    if not any(config.get(key) for key in MOE_EXPERT_FIELDS):
        raise ValueError(
            f"RolloutConfig.return_routed_experts=True but {model_path} is a dense model (its "
            f"config has none of {list(MOE_EXPERT_FIELDS)}): expected a mixture-of-experts "
            "model, or return_routed_experts=False"
        )


def decode_routed_experts(value: Any, num_tokens: int, topk: int, backend: str) -> Tensor:
    """``value`` (array, tensor or base64 of int32) as int16 [num_tokens, layers, topk] on CPU;
    ``num_tokens`` is prompt + generated - 1. Raises naming ``backend`` when it does not fit."""
    if isinstance(value, str):
        array = np.frombuffer(base64.b64decode(value), dtype="<i4")
    elif isinstance(value, Tensor):
        array = value.detach().cpu().numpy()
    else:
        array = np.asarray(value)
    size = int(array.size)
    if num_tokens <= 0 or size % (num_tokens * topk) or size == 0:
        raise RuntimeError(
            f"{backend} returned routed experts of {size} values (shape {array.shape}): "
            f"expected [tokens={num_tokens}, layers, top_k={topk}]"
        )
    layers = size // (num_tokens * topk)
    flat = torch.from_numpy(np.ascontiguousarray(array).astype(np.int16).reshape(-1))
    return flat.reshape(num_tokens, layers, topk)

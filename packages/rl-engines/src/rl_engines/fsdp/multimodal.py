"""Vision-language inputs of a micro-batch: processor outputs and multimodal rotary positions.

A batch row of a vision-language model carries its processor outputs in the non-tensor
field ``multi_modal_inputs``: a dict of tensors (``pixel_values`` [patches, C*T*P*P],
``image_grid_thw`` [images, 3]) or None for a text-only row. The rows' tensors are
concatenated along dim 0 in row order and passed to the model as keyword arguments.

``position_ids`` in the batch stay the [B, S] text positions every engine checks; for a
model with multimodal rotary embeddings (Qwen2-VL, Qwen2.5-VL: ``get_rope_index``) the
[3, B, S] positions (temporal, height, width) are derived here, on the engine's device,
from ``input_ids``, ``attention_mask`` and ``image_grid_thw``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from rl_core.protocol import DataProto

__all__ = ["MULTI_MODAL_KEY", "multimodal_kwargs"]

MULTI_MODAL_KEY = "multi_modal_inputs"


def _rope_index_owner(model: nn.Module) -> Any:
    for owner in (getattr(model, "model", None), model):
        if owner is not None and callable(getattr(owner, "get_rope_index", None)):
            return owner
    return None


def multimodal_kwargs(
    model: nn.Module,
    micro_batch: DataProto,
    tensors: dict[str, Tensor],
    device: torch.device,
    compute_dtype: torch.dtype | None = None,
) -> dict[str, Tensor]:
    """Extra model keyword arguments for the rows' images (empty for a text-only batch);
    floating-point inputs (pixel values) arrive in `compute_dtype`."""
    rows = micro_batch.non_tensor_batch.get(MULTI_MODAL_KEY)
    if rows is None:
        return {}
    pieces: dict[str, list[Tensor]] = {}
    for index, row in enumerate(rows):
        if row is None:
            continue
        if not isinstance(row, dict) or not all(isinstance(v, Tensor) for v in row.values()):
            raise ValueError(
                f"{MULTI_MODAL_KEY}[{index}] is {type(row).__name__}: expected None or a dict "
                "of processor output tensors (pixel_values, image_grid_thw)"
            )
        for key, value in row.items():
            pieces.setdefault(key, []).append(value)
    if not pieces:
        return {}
    kwargs = {}
    for key, values in pieces.items():
        value = torch.cat(values).to(device)
        if compute_dtype is not None and value.is_floating_point():
            value = value.to(compute_dtype)  # FSDP mixed precision does not cast inputs
        kwargs[key] = value
    owner = _rope_index_owner(model)
    if owner is not None:
        config = model.config
        image_token = getattr(config, "image_token_id", None)
        if image_token is None:
            raise ValueError(f"{type(model).__name__}.config has no image_token_id")
        input_ids = tensors["input_ids"]
        token_types = (input_ids == image_token).int()
        found, expected = int(token_types.sum()), _image_tokens(kwargs, config)
        if expected is not None and found != expected:
            raise ValueError(
                f"micro-batch has {found} image placeholder tokens (id {image_token}) but its "
                f"images need {expected}: expected processor-expanded prompt ids"
            )
        position_ids, _ = owner.get_rope_index(
            input_ids=input_ids,
            mm_token_type_ids=token_types,
            image_grid_thw=kwargs.get("image_grid_thw"),
            attention_mask=tensors["attention_mask"],
        )
        kwargs["position_ids"] = position_ids
    return kwargs


def _image_tokens(kwargs: dict[str, Tensor], config: Any) -> int | None:
    grid = kwargs.get("image_grid_thw")
    merge = getattr(getattr(config, "vision_config", None), "spatial_merge_size", None)
    if grid is None or merge is None:
        return None
    return int((grid.prod(-1) // merge**2).sum())

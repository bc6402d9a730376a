"""The model's processor: text with image placeholders + images -> model inputs.

``AutoProcessor``, or without torchvision (Qwen2-VL's video processor needs it)
`ImageTextProcessor`, which expands placeholders as Qwen2-VL does (one token per
``merge_size**2`` patches). Both return ``input_ids``, ``attention_mask``, ``pixel_values``
and ``image_grid_thw``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["ImageTextProcessor", "load_processor"]

log = logging.getLogger(__name__)


class ImageTextProcessor:
    """Image processor + tokenizer with Qwen2-VL placeholder expansion (no video)."""

    def __init__(self, image_processor: Any, tokenizer: Any, image_token: str = "<|image_pad|>"):
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.image_token = image_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
        self.merge_size = int(getattr(image_processor, "merge_size", 2))

    def __call__(
        self, text: Sequence[str], images: Sequence[Any] | None = None, return_tensors: str = "pt"
    ) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        texts = list(text)
        if images:
            vision = self.image_processor(images=list(images), return_tensors="pt")
            out["pixel_values"] = vision["pixel_values"]
            out["image_grid_thw"] = vision["image_grid_thw"]
            counts = iter((vision["image_grid_thw"].prod(-1) // self.merge_size**2).tolist())
            expanded = []
            for t in texts:
                pieces = t.split(self.image_token)
                body = pieces[0]
                for piece in pieces[1:]:
                    body += "<|placeholder|>" * next(counts) + piece
                expanded.append(body.replace("<|placeholder|>", self.image_token))
            texts = expanded
        tokens = self.tokenizer(texts, return_tensors=return_tensors, padding=True)
        out["input_ids"] = tokens["input_ids"]
        out["attention_mask"] = tokens["attention_mask"]
        return out


def load_processor(path: str) -> Any:
    """The processor of the model directory `path` (see the module docstring)."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    try:
        return AutoProcessor.from_pretrained(path)
    except ImportError as exc:  # the Qwen2-VL video processor needs torchvision
        reason = (str(exc).strip().splitlines() or ["ImportError"])[0]
        log.info("%s: AutoProcessor unavailable (%s): image processor + tokenizer", path, reason)
    return ImageTextProcessor(
        AutoImageProcessor.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    )

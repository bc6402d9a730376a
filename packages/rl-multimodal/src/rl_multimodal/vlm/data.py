"""Vision-language prompts from verl-style rows: an ``images`` column and ``<image>`` marks.

``images`` items: PNG/JPEG bytes, ``{"bytes"}`` / ``{"path"}`` dicts, paths or PIL images; one
``<image>`` mark per image, in order. Rows are processed once at load into ``raw_prompt_ids``,
``multi_modal_data`` and ``multi_modal_inputs`` (the package README: how images travel).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_algos.data.dataset import PromptDataset
from rl_algos.data.io import read_rows
from rl_multimodal.vlm.processor import load_processor

__all__ = ["IMAGE_PLACEHOLDER", "VLMPromptDataset", "load_image"]

IMAGE_PLACEHOLDER = "<image>"
QWEN_IMAGE_MARKUP = "<|vision_start|><|image_pad|><|vision_end|>"


def load_image(value: Any, where: str) -> Any:
    """An RGB ``PIL.Image`` from bytes, a ``{"bytes"|"path"}`` dict, a path or an image;
    ValueError naming `where` when it cannot be read."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    source = value
    if isinstance(value, dict):
        source = value.get("bytes") or value.get("path")
    try:
        if isinstance(source, (bytes, bytearray)):
            image = Image.open(io.BytesIO(source))
        elif isinstance(source, (str, Path)) and str(source):
            image = Image.open(Path(source).expanduser())
        else:
            raise ValueError(
                f"got {type(value).__name__}: expected image bytes, a path, a PIL image or a "
                "dict with 'bytes' or 'path'"
            )
        image.load()
    except (OSError, UnidentifiedImageError) as exc:
        raise ValueError(f"{where}: the image cannot be read: {exc}") from exc
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc
    return image.convert("RGB")


class VLMPromptDataset(PromptDataset):
    """`PromptDataset` for rows with images; `processor` defaults to the tokenizer's model
    directory's, `image_markup` replaces each ``<image>`` (Qwen2-VL's vision tokens)."""

    def __init__(
        self,
        source: str | Path | Sequence[str | Path] | Sequence[dict[str, Any]],
        tokenizer: Any,
        max_prompt_length: int,
        *,
        prompt_key: str = "prompt",
        apply_chat_template: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        filter_overlong_prompts: bool = False,
        require_ground_truth: bool = False,
        name: str = "data",
        processor: Any = None,
        image_key: str = "images",
        image_markup: str = QWEN_IMAGE_MARKUP,
    ) -> None:
        if max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
        is_rows = not isinstance(source, (str, Path)) and all(isinstance(r, dict) for r in source)
        rows = [dict(r) for r in source] if is_rows else read_rows(source)  # type: ignore[arg-type]
        self.name, self.tokenizer, self.prompt_key = name, tokenizer, prompt_key
        self.require_ground_truth = require_ground_truth  # checked by PromptDataset._render
        self.max_prompt_length = max_prompt_length
        self.processor = processor or load_processor(tokenizer.name_or_path)
        self.num_rows = len(rows)
        self.items: list[dict[str, Any]] = []
        for index, row in enumerate(rows):
            text = self._render(row, index, apply_chat_template, chat_template_kwargs or {})
            images = self._images(row, index, image_key, text.count(IMAGE_PLACEHOLDER))
            text = text.replace(IMAGE_PLACEHOLDER, image_markup)
            inputs = self.processor(text=[text], images=images or None, return_tensors="pt")
            ids = inputs["input_ids"][0].tolist()
            if len(ids) > max_prompt_length:
                if not filter_overlong_prompts:
                    raise ValueError(
                        f"{name} row {index}: prompt has {len(ids)} tokens (image tokens "
                        f"included) > data.max_prompt_length={max_prompt_length} (raise it, or "
                        "set data.filter_overlong_prompts=true to drop such prompts)"
                    )
                continue
            row.pop(image_key, None)  # the decoded images travel in multi_modal_data
            row["raw_prompt_ids"] = ids
            row["index"] = index
            if images:
                row["multi_modal_data"] = {"image": images}
                row["multi_modal_inputs"] = {
                    "pixel_values": inputs["pixel_values"],
                    "image_grid_thw": inputs["image_grid_thw"],
                }
            self.items.append(row)
        self._count_filtered()

    def _images(self, row: dict[str, Any], index: int, key: str, marks: int) -> list[Any]:
        values = row.get(key)
        if values is None:
            values = []
        if not isinstance(values, (list, tuple)) and not hasattr(values, "tolist"):
            raise ValueError(
                f"{self.name} row {index}: {key!r} is {type(values).__name__}: expected a list "
                "of images (bytes, paths or {'bytes'|'path'} dicts)"
            )
        values = list(values)
        if len(values) != marks:
            raise ValueError(
                f"{self.name} row {index}: {len(values)} image(s) in {key!r} but {marks} "
                f"{IMAGE_PLACEHOLDER!r} placeholder(s) in the prompt: expected one per image"
            )
        return [load_image(v, f"{self.name} row {index}, {key}[{j}]") for j, v in enumerate(values)]

"""Prompt ids of image requests for engines that expand image placeholders themselves.

Trainers hold processor-expanded prompt ids: one ``<|image_pad|>`` per vision token, as the
policy sees them in training. vLLM and SGLang run the model's multimodal processor on
``prompt ids + images`` and expand every placeholder again, so they must receive one
placeholder per image: `collapse_placeholders` turns each run of the placeholder token into
a single token (runs of different images are separated by vision start/end tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["collapse_placeholders", "placeholder_token_ids"]


def placeholder_token_ids(hf_config: Any) -> tuple[int, ...]:
    """The image/video placeholder token ids of a Hugging Face VLM config (empty for text)."""
    ids = (getattr(hf_config, "image_token_id", None), getattr(hf_config, "video_token_id", None))
    return tuple(int(t) for t in ids if t is not None)


def collapse_placeholders(prompt_ids: Sequence[int], token_ids: Sequence[int]) -> list[int]:
    """`prompt_ids` with every run of one of `token_ids` shortened to a single token."""
    out: list[int] = []
    for token in prompt_ids:
        if token in token_ids and out and out[-1] == token:
            continue
        out.append(int(token))
    return out

"""Tiny random Qwen2-VL / Qwen2.5-VL models built from small configs (no hub download).

``model.path: tiny-random-vlm:qwen2_5_vl`` (or ``qwen2_vl``, via ``rl.model_sources``): a
cached directory with the model (2 text layers, hidden 64; 2 vision blocks, hidden 32), a
character-level ChatML tokenizer with Qwen's vision tokens and an image processor (14x14
patches, 2x2 merged: a 56x56 image costs 4 tokens).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["VISION_TOKENS", "build_tiny_vlm", "resolve_tiny_vlm"]

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
ARCHS = ("qwen2_vl", "qwen2_5_vl")
PREFIX = "tiny-random-vlm"
_VERSION = "v1"


def _tokenizer() -> Any:
    from rl_algos.trainer.model_source import _char_tokenizer

    tokenizer = _char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    return tokenizer


def _config(arch: str, tokenizer: Any) -> Any:
    import transformers

    from rl_algos.trainer.model_source import tiny_text_fields

    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in VISION_TOKENS}
    text = tiny_text_fields(tokenizer)
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "mrope_section": [2, 3, 3],
    }
    vision = dict(depth=2, num_heads=2, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    if arch == "qwen2_5_vl":
        vision.update(
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=64,
            window_size=56,
            fullatt_block_indexes=[1],
        )
        cls = transformers.Qwen2_5_VLConfig
    else:
        vision.update(embed_dim=32, hidden_size=64, mlp_ratio=2)
        cls = transformers.Qwen2VLConfig
    return cls(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def build_tiny_vlm(arch: str, out: str | Path, seed: int = 0) -> Path:
    """Write a tiny random `arch` model, its tokenizer and processor into the directory `out`."""
    import torch
    from transformers import AutoModelForImageTextToText, Qwen2VLImageProcessor

    if arch not in ARCHS:
        raise ValueError(f"tiny VLM architecture {arch!r} is unknown: expected one of {ARCHS}")
    out = Path(out)
    tokenizer = _tokenizer()
    config = _config(arch, tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    image_processor = Qwen2VLImageProcessor(
        patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=28 * 28, max_pixels=112 * 112
    )
    for part in (model, tokenizer, image_processor):
        part.save_pretrained(out)
    return out


def resolve_tiny_vlm(arch: str) -> str:
    """The ``rl.model_sources`` hook for ``tiny-random-vlm:<arch>``: a cached directory."""
    from rl_algos.trainer.model_source import build_once, cache_dir

    return build_once(
        cache_dir() / f"{PREFIX}-{arch}-{_VERSION}", lambda out: build_tiny_vlm(arch, out)
    )

"""Vision-language RL: image datasets with the model's processor, the ``shapes`` task and
tiny random Qwen2-VL / Qwen2.5-VL models (see the package README for what is supported)."""

from rl_multimodal.vlm.data import IMAGE_PLACEHOLDER, VLMPromptDataset, load_image
from rl_multimodal.vlm.processor import ImageTextProcessor, load_processor
from rl_multimodal.vlm.shapes import ShapesTask, compute_score
from rl_multimodal.vlm.tiny import build_tiny_vlm

__all__ = [
    "IMAGE_PLACEHOLDER",
    "ImageTextProcessor",
    "ShapesTask",
    "VLMPromptDataset",
    "build_tiny_vlm",
    "compute_score",
    "load_image",
    "load_processor",
]

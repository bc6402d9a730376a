"""The NVIDIA CUDA platform: NCCL, CUDA_VISIBLE_DEVICES, Ray resource "GPU"."""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

import torch

from rl_core.platform import MemoryInfo, Platform

__all__ = ["CudaPlatform"]

FLASH_ATTENTION_MIN_CAPABILITY = (8, 0)  # flash-attn 2 needs Ampere or newer


class CudaPlatform(Platform):
    """NVIDIA GPUs through torch's CUDA build."""

    name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    ray_resource = "GPU"
    package = "rl-nvidia"
    priority = 10

    def is_available(self) -> bool:
        if torch.version.hip is not None or torch.version.cuda is None:
            return False
        try:
            return bool(torch.cuda.is_available())
        except Exception:
            return False

    def matches_torch_build(self) -> bool:
        return torch.version.cuda is not None and torch.version.hip is None

    def unavailable_reason(self) -> str:
        if torch.version.hip is not None:
            return (
                f"torch {torch.__version__} is a ROCm build: use the 'rocm' platform "
                "(pip install rl-amd)"
            )
        if torch.version.cuda is None:
            return f"torch {torch.__version__} is built without CUDA: install a CUDA build of torch"
        visible = os.environ.get(self.visible_devices_env, "<unset>")
        return (
            f"torch.cuda.is_available() is False (torch {torch.__version__}, CUDA "
            f"{torch.version.cuda}, {self.visible_devices_env}={visible}): no NVIDIA GPU or "
            "driver is visible to this process"
        )

    def device_count(self) -> int:
        return int(torch.cuda.device_count()) if self.is_available() else 0

    def torch_module(self) -> ModuleType:
        self.require_available()
        return torch.cuda

    def memory_info(self, index: int | None = None) -> MemoryInfo:
        self.require_available()
        free, total = torch.cuda.mem_get_info(self.current_device() if index is None else index)
        return MemoryInfo(free=int(free), total=int(total))

    def preferred_attention(self) -> str:
        """flash_attention_2 when flash-attn is installed and the GPU is Ampere+, else sdpa."""
        if not self.is_available() or importlib.util.find_spec("flash_attn") is None:
            return "sdpa"
        if torch.cuda.get_device_capability() < FLASH_ATTENTION_MIN_CAPABILITY:
            return "sdpa"
        return "flash_attention_2"

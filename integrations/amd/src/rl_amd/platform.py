"""The AMD ROCm platform: torch's "cuda" device type on HIP, RCCL, HIP_VISIBLE_DEVICES."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from types import ModuleType

import torch

from rl_core.platform import MemoryInfo, Platform

__all__ = ["RocmPlatform"]


class RocmPlatform(Platform):
    """AMD GPUs through torch's ROCm build (torch calls them ``cuda`` devices).

    Visibility: ``HIP_VISIBLE_DEVICES`` is set to the devices a worker was given (it is the
    variable Ray uses for AMD GPUs). ``ROCR_VISIBLE_DEVICES`` filters devices before HIP
    does, so when it is set (by a job scheduler) the ids are relative to it and it is left
    alone. ``CUDA_VISIBLE_DEVICES`` is honoured by HIP too, so it is cleared to keep one
    source of truth.
    """

    name = "rocm"
    device_type = "cuda"
    dist_backend = "nccl"  # RCCL behind torch's NCCL backend name
    visible_devices_env = "HIP_VISIBLE_DEVICES"
    related_visible_devices_envs = ("ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
    ray_resource = "GPU"
    package = "rl-amd"
    priority = 10

    def is_available(self) -> bool:
        if torch.version.hip is None:
            return False
        try:
            return bool(torch.cuda.is_available())
        except Exception:
            return False

    def matches_torch_build(self) -> bool:
        return torch.version.hip is not None

    def unavailable_reason(self) -> str:
        if torch.version.hip is None:
            return (
                f"torch {torch.__version__} is not a ROCm build (torch.version.hip is None): "
                "install torch from the ROCm wheel index"
            )
        visible = {
            env: os.environ.get(env, "<unset>")
            for env in (self.visible_devices_env, *self.related_visible_devices_envs)
        }
        return (
            f"torch.cuda.is_available() is False on ROCm {torch.version.hip} "
            f"({', '.join(f'{k}={v}' for k, v in visible.items())}): no AMD GPU is visible"
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

    def visible_devices_env_updates(self, device_ids: Sequence[str]) -> dict[str, str | None]:
        updates = super().visible_devices_env_updates(device_ids)
        updates["CUDA_VISIBLE_DEVICES"] = None
        return updates

    def preferred_attention(self) -> str:
        """flash_attention_2 when the ROCm build of flash-attn is installed, else sdpa."""
        if self.is_available() and importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
        return "sdpa"

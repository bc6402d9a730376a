"""The Huawei Ascend platform: torch_npu, HCCL, ASCEND_RT_VISIBLE_DEVICES, Ray "NPU"."""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

import torch

from rl_core.platform import MemoryInfo, Platform

__all__ = ["NpuPlatform"]


def _torch_npu() -> ModuleType | None:
    """Import torch_npu (which adds ``torch.npu``) on first use; None when not installed."""
    if importlib.util.find_spec("torch_npu") is None:
        return None
    return importlib.import_module("torch_npu")


class NpuPlatform(Platform):
    """Ascend NPUs through the ``torch_npu`` extension, imported only when needed."""

    name = "npu"
    device_type = "npu"
    dist_backend = "hccl"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    ray_resource = "NPU"
    package = "rl-ascend"
    priority = 10

    def is_available(self) -> bool:
        try:
            if _torch_npu() is None:
                return False
            return bool(torch.npu.is_available())
        except Exception:
            return False

    def unavailable_reason(self) -> str:
        if importlib.util.find_spec("torch_npu") is None:
            return (
                "torch_npu is not installed: install the torch-npu build matching "
                f"torch {torch.__version__} and the CANN toolkit"
            )
        try:
            _torch_npu()
        except Exception as exc:
            return f"torch_npu failed to import: {type(exc).__name__}: {exc}"
        visible = os.environ.get(self.visible_devices_env, "<unset>")
        return (
            f"torch.npu.is_available() is False ({self.visible_devices_env}={visible}): "
            "no Ascend NPU or driver is visible"
        )

    def device_count(self) -> int:
        return int(torch.npu.device_count()) if self.is_available() else 0

    def torch_module(self) -> ModuleType:
        self.require_available()
        return torch.npu

    def memory_info(self, index: int | None = None) -> MemoryInfo:
        self.require_available()
        free, total = torch.npu.mem_get_info(self.current_device() if index is None else index)
        return MemoryInfo(free=int(free), total=int(total))

    def preferred_attention(self) -> str:
        """transformers routes flash_attention_2 to torch_npu's fused attention on NPUs."""
        return "flash_attention_2" if self.is_available() else "sdpa"

"""The compute dtype check both engines make at construction."""

from __future__ import annotations

import torch

from rl_core.config import ConfigError
from rl_core.platform import get_platform

__all__ = ["check_platform_dtype"]


def check_platform_dtype(path: str, value: str, dtype: torch.dtype) -> None:
    """Raise `ConfigError` for ``path`` unless the platform computes in ``dtype`` (the
    resolved ``value``; e.g. bfloat16 on a GPU without bf16 support)."""
    platform = get_platform()
    if not platform.supports_dtype(dtype):
        raise ConfigError(
            path,
            f"a dtype the {platform.name} platform computes in (this device has no "
            f"{str(dtype).removeprefix('torch.')} support); use float32",
            value=value,
        )

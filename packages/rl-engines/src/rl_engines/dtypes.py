"""The compute dtype check both engines make at construction."""

from __future__ import annotations

import logging

import torch

from rl_core.config import ConfigError
from rl_core.platform import get_platform

__all__ = ["check_platform_dtype"]

log = logging.getLogger(__name__)


def cpu_has_fast_bf16() -> bool:
    """Whether oneDNN runs bfloat16 matmuls on this CPU (AVX512 cores; with AVX512-BF16
    or AMX they are ~2x faster than float32). Without it bfloat16 falls back to slow
    reference kernels."""
    return bool(
        torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


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
    if dtype == torch.bfloat16 and platform.device_type == "cpu" and not cpu_has_fast_bf16():
        log.warning(
            "%s=%s on a CPU without oneDNN bfloat16 support: its matmuls fall back to slow "
            "kernels, float32 is likely faster here",
            path,
            value,
        )

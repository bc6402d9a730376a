"""Shared fixtures: tiny random Qwen2-VL / Qwen2.5-VL directories (helpers: vlm_cases)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")


@pytest.fixture(scope="session")
def vlm_dirs(tmp_path_factory) -> dict[str, str]:
    from rl_multimodal.vlm import build_tiny_vlm

    root = tmp_path_factory.mktemp("tiny-vlm")
    return {arch: str(build_tiny_vlm(arch, root / arch)) for arch in ("qwen2_5_vl", "qwen2_vl")}

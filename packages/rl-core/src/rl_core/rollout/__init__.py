"""Rollout-engine contract: `RolloutEngine`, `SamplingParams`, `GenerationOutput`, registry.

Implementations live in rl-rollout (``hf``, ``vllm``, ``sglang``) or in third-party
packages registering under the ``rl.rollouts`` entry point group; every implementation runs
the conformance suite in ``rl_core.testing.rollout_engine``.
"""

from rl_core.rollout.base import (
    ROLLOUTS,
    ROUTED_EXPERTS,
    FinishReason,
    GenerationOutput,
    RolloutConfig,
    RolloutEngine,
    SamplingParams,
    build_rollout_engine,
    check_prompt,
    check_stop_token_ids,
    logprob_temperature,
)
from rl_core.rollout.generator import (
    SEQUENCE_GENERATORS,
    SequenceGenerator,
    build_sequence_generator,
)

__all__ = [
    "ROLLOUTS",
    "ROUTED_EXPERTS",
    "SEQUENCE_GENERATORS",
    "FinishReason",
    "GenerationOutput",
    "RolloutConfig",
    "RolloutEngine",
    "SamplingParams",
    "SequenceGenerator",
    "build_rollout_engine",
    "build_sequence_generator",
    "check_prompt",
    "check_stop_token_ids",
    "logprob_temperature",
]

"""The trainer's config: typed sections (`RLConfig`), algorithm presets and the loader.

cfg = load_config("examples/grpo_tiny.yaml", ["actor.optim.lr=1e-5", "algorithm.preset=dapo"])
"""

from rl_algos.config.distill_section import DistillConfig
from rl_algos.config.env_section import EnvConfig, EnvSpec
from rl_algos.config.judge_section import JudgeConfig
from rl_algos.config.loader import GROUP_ESTIMATORS, check_plugins, load_config
from rl_algos.config.presets import PRESETS
from rl_algos.config.schema import (
    LOGGERS,
    ActorConfig,
    AlgorithmConfig,
    CriticConfig,
    DataConfig,
    DynamicSamplingConfig,
    KLControlConfig,
    OverlongConfig,
    PolicyModelConfig,
    RewardConfig,
    RLConfig,
    RolloutSectionConfig,
    TrainerConfig,
)
from rl_algos.config.vla_section import VLA_ENV_GROUPS, VLA_ENVS, VLAConfig, is_vla_run
from rl_algos.errors import ConfigError

__all__ = [
    "GROUP_ESTIMATORS",
    "LOGGERS",
    "PRESETS",
    "VLA_ENVS",
    "VLA_ENV_GROUPS",
    "ActorConfig",
    "AlgorithmConfig",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "DistillConfig",
    "DynamicSamplingConfig",
    "EnvConfig",
    "EnvSpec",
    "JudgeConfig",
    "KLControlConfig",
    "OverlongConfig",
    "PolicyModelConfig",
    "RLConfig",
    "RewardConfig",
    "RolloutSectionConfig",
    "TrainerConfig",
    "VLAConfig",
    "check_plugins",
    "is_vla_run",
    "load_config",
]

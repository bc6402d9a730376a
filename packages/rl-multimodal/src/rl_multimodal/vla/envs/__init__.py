"""Environments for VLA RL: the Gymnasium adapter, built-in tasks and their registry."""

from rl_multimodal.vla.envs.gymnasium_adapter import GymnasiumVectorEnv
from rl_multimodal.vla.envs.reach import ReachConfig, ReachEnv

__all__ = ["GymnasiumVectorEnv", "ReachConfig", "ReachEnv"]

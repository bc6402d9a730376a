"""Environments for VLA RL: the Gymnasium adapter, worker processes and built-in tasks."""

from rl_multimodal.vla.envs.gymnasium_adapter import GymnasiumVectorEnv
from rl_multimodal.vla.envs.reach import ReachConfig, ReachEnv
from rl_multimodal.vla.envs.workers import EnvWorkerError, EnvWorkerPool

__all__ = ["EnvWorkerError", "EnvWorkerPool", "GymnasiumVectorEnv", "ReachConfig", "ReachEnv"]

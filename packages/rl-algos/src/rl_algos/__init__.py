"""RL algorithms (PPO, GRPO, DAPO, GSPO), rewards, the single-controller trainer and the `rl` CLI."""

from importlib.metadata import version as _version

__version__ = _version("rl-algos")

__all__ = ["__version__"]

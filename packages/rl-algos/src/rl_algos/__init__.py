"""RL algorithms (PPO, GRPO, DAPO, GSPO), rewards, the single-controller trainer and the `rl` CLI."""

__version__ = "0.1.0"

__all__ = ["__version__"]

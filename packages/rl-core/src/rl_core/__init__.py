"""Minimal protocol of the RL framework: DataProto, workers, dispatch, registry and engine/rollout/platform contracts."""

__version__ = "0.1.0"

__all__ = ["__version__"]

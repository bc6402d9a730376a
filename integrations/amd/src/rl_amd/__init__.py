"""AMD ROCm platform plugin for the RL framework."""

from importlib.metadata import version as _version

__version__ = _version("rl-amd")

__all__ = ["__version__"]

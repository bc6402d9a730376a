"""Vision-language and vision-language-action support for the RL framework."""

from importlib.metadata import version as _version

__version__ = _version("rl-multimodal")

__all__ = ["__version__"]

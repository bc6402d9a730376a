"""Vision-language and vision-language-action support for the RL framework."""

__version__ = "0.1.0"

__all__ = ["__version__"]

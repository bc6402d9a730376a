"""Rollout engines (vLLM, SGLang, Hugging Face reference), async rollout manager, agent loop and tools."""

from importlib.metadata import version as _version

__version__ = _version("rl-rollout")

__all__ = ["__version__"]

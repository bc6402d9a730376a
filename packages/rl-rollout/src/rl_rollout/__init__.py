"""Rollout engines (vLLM, SGLang, Hugging Face reference), async rollout manager, agent loop and tools."""

__version__ = "0.1.0"

__all__ = ["__version__"]

"""Megatron-core training engine (extra ``rl-engines[megatron]``), registered as
``megatron`` in ``rl.engines``: TP, PP with virtual stages, EP, expert-TP and sequence
parallelism for Hugging Face Llama / Qwen2 / Qwen3 / Qwen3-MoE models."""

try:  # the extra's dependencies, checked when the engine is looked up
    import megatron.core  # noqa: F401
    import transformers  # noqa: F401
except ImportError as exc:
    raise ImportError(
        "the megatron engine needs megatron-core and transformers: "
        "pip install 'rl-engines[megatron]'"
    ) from exc

from rl_engines.megatron.config import MegatronConfig
from rl_engines.megatron.engine import MegatronEngine

__all__ = ["MegatronConfig", "MegatronEngine"]

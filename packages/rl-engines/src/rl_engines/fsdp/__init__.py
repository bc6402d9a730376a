"""FSDP2 training engine (extra ``rl-engines[fsdp]``), registered as ``fsdp`` in ``rl.engines``."""

try:  # the extra's dependency, checked when the engine is looked up
    import transformers  # noqa: F401
except ImportError as exc:
    raise ImportError("the fsdp engine needs transformers: pip install 'rl-engines[fsdp]'") from exc

from rl_engines.fsdp.engine import FSDPEngine

__all__ = ["FSDPEngine"]

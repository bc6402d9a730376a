"""Models that are not plain Hugging Face causal LMs, built by name (``ModelConfig.builder``).

A package registers a builder under the ``rl.models`` entry point group; a config with
``model.builder: <name>`` then makes every engine that supports it (the fsdp engine) build
the model with ``builder(model_config, seed)`` instead of loading a Hugging Face model.
``ModelConfig.path`` still names the Hugging Face directory the builder starts from, and
``ModelConfig.builder_options`` are the builder's own keyword options.

The module a builder returns is an `RLModel`:

* ``_no_split_modules``: the class names of its layers (the engine shards each of them);
* ``rl_output_kinds``: the outputs it computes, some of ``("log_probs", "entropy",
  "values")`` (a policy with a value head on its own trunk offers all three);
* ``forward(micro_batch, outputs, temperature)`` returns ``{kind: [b, R] tensor}`` for the
  rows' response positions (``responses``/``response_mask`` of the batch convention), with
  gradients; the micro-batch's tensors are on the module's device;
* ``export_metadata()`` (optional): a JSON-serialisable dict that an export writes beside
  the weights (``rl_model.json``) so the model acts the same outside the framework.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from rl_core.registry import Registry

__all__ = ["MODEL_BUILDERS", "RLModel"]


@runtime_checkable
class RLModel(Protocol):
    """What an engine needs from a model built by a registered builder (module docstring)."""

    rl_output_kinds: tuple[str, ...]

    def forward(self, micro_batch: Any, outputs: tuple[str, ...], temperature: float) -> Any: ...


MODEL_BUILDERS: Registry[Callable[..., Any]] = Registry("rl.models", kind="model builder")
"""Model builders by name: ``builder(model_config, seed) -> RLModel``."""

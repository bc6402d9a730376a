"""Worker-side half of the ``vllm`` backend's weight update (a vLLM worker extension).

vLLM mixes this class into every worker (``worker_extension_cls``) and the engine calls
its methods with ``collective_rpc``. Method names carry an ``rl_`` prefix so they never
clash with the worker's own (vLLM workers have ``update_weights`` of their own).
This module is imported inside vLLM's worker processes; it imports nothing from rl_core.
"""

from __future__ import annotations

from rl_rollout.backends.weight_files import read_bucket

__all__ = ["RLWorkerExtension"]


class RLWorkerExtension:
    """Loads Hugging Face-named weights in place into the worker's model."""

    def rl_load_weight_files(self, paths: list[str]) -> list[str]:
        """Load every tensor of the given safetensors files; return the names loaded.

        Uses the model's own ``load_weights`` (name mapping, fused q/k/v and gate/up
        projections, tensor-parallel sharding), which copies into the existing parameter
        storage, so a subset of the weights updates just that subset.
        """
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        names: list[str] = []

        def weights():
            for path in paths:
                for name, tensor in read_bucket(path):
                    names.append(name)
                    yield name, tensor

        try:
            model.load_weights(weights=weights())
        except (KeyError, ValueError) as exc:
            name = names[-1] if names else "?"
            raise ValueError(
                f"update_weights: could not load {name!r} into {type(model).__name__} "
                f"(expected Hugging Face checkpoint names): {str(exc)[:200]}"
            ) from None
        return names

    def rl_weight_checksum(self) -> float:
        """Sum of every parameter (float64): a cheap fingerprint for tests."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return float(sum(p.detach().double().sum() for p in model.parameters()))

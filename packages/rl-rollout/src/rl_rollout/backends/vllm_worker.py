"""Worker-side half of the ``vllm`` backend's weight update (a vLLM worker extension).

vLLM mixes this class into every worker (``worker_extension_cls``) and the engine calls
its methods with ``collective_rpc``. Method names carry an ``rl_`` prefix so they never
clash with the worker's own (vLLM workers have ``update_weights`` of their own).

One update is a session, the same steps as vLLM's own ``reload_weights`` spread over
several calls so that weights can arrive in size-bounded buckets: `rl_begin_weight_update`
(vLLM's layerwise reload: each layer is rebuilt and re-processed once all its weights have
arrived), any number of `rl_load_weight_files`, then `rl_finish_weight_update` (layers that
received nothing keep their current weights). An update must therefore bring every tensor
of each layer it touches; a trainer's full export does.
This module is imported inside vLLM's worker processes; it imports nothing from rl_core.
"""

from __future__ import annotations

from rl_rollout.backends.weight_files import read_bucket

__all__ = ["RLWorkerExtension"]


class RLWorkerExtension:
    """Loads Hugging Face-named weights in place into the worker's model."""

    def _rl_context(self):
        from vllm.config import set_current_vllm_config

        return set_current_vllm_config(self.vllm_config)  # type: ignore[attr-defined]

    def rl_begin_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        with self._rl_context():
            initialize_layerwise_reload(self.model_runner.get_model())  # type: ignore[attr-defined]

    def rl_load_weight_files(self, paths: list[str]) -> list[str]:
        """Load every tensor of the given safetensors files; return the names loaded."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        names: list[str] = []

        def weights():
            for path in paths:
                for name, tensor in read_bucket(path):
                    names.append(name)
                    yield name, tensor

        try:
            with self._rl_context():
                model.load_weights(weights=weights())
        except (KeyError, ValueError) as exc:
            name = names[-1] if names else "?"
            raise ValueError(
                f"update_weights: could not load {name!r} into {type(model).__name__} "
                f"(expected Hugging Face checkpoint names): {str(exc)[:200]}"
            ) from None
        return names

    def rl_finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        runner = self.model_runner  # type: ignore[attr-defined]
        with self._rl_context():
            finalize_layerwise_reload(runner.get_model(), self.vllm_config.model_config)  # type: ignore[attr-defined]
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            if callable(getattr(runner, reset, None)):
                getattr(runner, reset)()

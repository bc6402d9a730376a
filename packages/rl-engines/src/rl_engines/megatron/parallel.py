"""megatron-core's ``parallel_state`` set up once per process from a `MegatronConfig`.

Building a second engine with the same layout in a process (tests, a reference model
beside the actor) reuses the process groups; a different layout re-initialises them.
"""

from __future__ import annotations

from dataclasses import dataclass

from rl_engines.megatron.config import MegatronConfig

__all__ = ["ParallelState"]


@dataclass(frozen=True)
class ParallelState:
    tp: int
    pp: int
    vpp: int | None
    ep: int
    etp: int
    cp: int

    _current = None

    @classmethod
    def ensure(cls, cfg: MegatronConfig, timeout_s: float, seed: int) -> ParallelState:
        """Initialise (or reuse) the model-parallel groups and seed Megatron's RNG tracker."""
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        want = cls(
            cfg.tensor_parallel_size,
            cfg.pipeline_parallel_size,
            cfg.virtual_pipeline_size,
            cfg.expert_parallel_size,
            cfg.etp,
            cfg.context_parallel_size,
        )
        if ParallelState._current != want or not ps.model_parallel_is_initialized():
            if ps.model_parallel_is_initialized():
                ps.destroy_model_parallel()
            ps.initialize_model_parallel(
                tensor_model_parallel_size=want.tp,
                pipeline_model_parallel_size=want.pp,
                virtual_pipeline_model_parallel_size=want.vpp,
                context_parallel_size=want.cp,
                expert_model_parallel_size=want.ep,
                expert_tensor_parallel_size=want.etp,
                distributed_timeout_minutes=timeout_s / 60,  # a timedelta of minutes
                create_gloo_process_groups=False,
            )
            ParallelState._current = want
        model_parallel_cuda_manual_seed(seed, force_reset_rng=True)
        return want

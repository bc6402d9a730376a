"""`MegatronConfig`: the Megatron engine's parallel layout and options, from one place.

TP/PP/EP sizes come from `rl_core.engine.ParallelConfig` (``tensor_parallel_size``,
``pipeline_parallel_size``, ``expert_parallel_size``); the Megatron-only options come from
``EngineConfig.engine_kwargs`` (keys are the field names below). `from_engine_config`
merges both and `validate` checks every field against the world size, raising
``ValueError`` naming the field, its value and what was expected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rl_core.config import ConfigError, dataclass_from_dict
from rl_core.config import is_int as _is_int
from rl_core.engine import EngineConfig

__all__ = ["MegatronConfig"]

DISPATCHERS = ("allgather", "alltoall")


@dataclass
class MegatronConfig:
    """Parallelism and Megatron options of one engine.

    ``virtual_pipeline_size``: model chunks per pipeline stage (interleaved 1F1B; None:
    one). ``expert_tensor_parallel_size``: TP inside each expert (None: 1).
    ``context_parallel_size`` > 1 needs Transformer Engine's attention, which this engine
    does not use: it is rejected at start-up. ``sequence_parallel`` splits activations
    outside attention/MLP along the sequence over the TP ranks (needs TP > 1).
    ``moe_token_dispatcher``: "allgather" (CPU and GPU) or "alltoall" (GPU only).
    ``moe_aux_loss_coeff``: load-balancing loss weight (None: the Hugging Face config's
    ``router_aux_loss_coef``, 0 if it has none); the loss is the mean over micro-batches
    and data-parallel ranks. ``logits_chunk_tokens``: tokens per chunk of the
    vocab-parallel log-prob/entropy computation.
    """

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    virtual_pipeline_size: int | None = None
    expert_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None
    context_parallel_size: int = 1
    sequence_parallel: bool = False
    moe_token_dispatcher: Literal["allgather", "alltoall"] = "allgather"
    moe_aux_loss_coeff: float | None = None
    logits_chunk_tokens: int = 4096

    @classmethod
    def from_engine_config(cls, config: EngineConfig) -> MegatronConfig:
        kwargs = dict(config.engine_kwargs)
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "expert_parallel_size"):
            if name in kwargs:
                raise ValueError(
                    f"EngineConfig.engine_kwargs[{name!r}]: set parallel.{name} instead "
                    "(one place for each size)"
                )
            kwargs[name] = getattr(config.parallel, name)
        return dataclass_from_dict(cls, kwargs, "EngineConfig.engine_kwargs (megatron engine)")

    @property
    def etp(self) -> int:
        return self.expert_tensor_parallel_size or 1

    @property
    def vpp(self) -> int:
        return self.virtual_pipeline_size or 1

    def data_parallel_size(self, world_size: int) -> int:
        return world_size // (
            self.tensor_parallel_size * self.pipeline_parallel_size * self.context_parallel_size
        )

    def _bad(self, name: str, expected: str) -> ValueError:
        return ValueError(
            f"MegatronConfig.{name}={getattr(self, name)!r} is invalid: expected {expected}"
        )

    def validate(self, world_size: int, device_type: str) -> MegatronConfig:
        for name in (
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "expert_parallel_size",
            "context_parallel_size",
            "logits_chunk_tokens",
        ):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise self._bad(name, "an integer >= 1")
        for name in ("virtual_pipeline_size", "expert_tensor_parallel_size"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise self._bad(name, "None or an integer >= 1")
        if self.virtual_pipeline_size not in (None, 1) and self.pipeline_parallel_size < 2:
            raise self._bad("virtual_pipeline_size", "None unless pipeline_parallel_size > 1")
        if not isinstance(self.sequence_parallel, bool):
            raise self._bad("sequence_parallel", "true or false")
        if self.sequence_parallel and self.tensor_parallel_size == 1:
            raise self._bad("sequence_parallel", "false when tensor_parallel_size == 1")
        if self.moe_token_dispatcher not in DISPATCHERS:
            raise self._bad("moe_token_dispatcher", f"one of {DISPATCHERS}")
        if self.moe_token_dispatcher == "alltoall" and device_type == "cpu":
            raise self._bad(
                "moe_token_dispatcher", "'allgather' on CPU (megatron-core's alltoall needs CUDA)"
            )
        if self.moe_aux_loss_coeff is not None and (
            isinstance(self.moe_aux_loss_coeff, bool)
            or not isinstance(self.moe_aux_loss_coeff, (int, float))
            or self.moe_aux_loss_coeff < 0
        ):
            raise self._bad("moe_aux_loss_coeff", "None or a number >= 0")
        if self.context_parallel_size > 1:
            raise self._bad(
                "context_parallel_size",
                "1: megatron-core's context parallelism needs Transformer Engine's attention "
                "(TEDotProductAttention), which this engine does not use",
            )
        model_parallel = self.tensor_parallel_size * self.pipeline_parallel_size
        if world_size % model_parallel:
            name = "tensor" if self.tensor_parallel_size > 1 else "pipeline"
            raise ConfigError(
                f"parallel.{name}_parallel_size",
                f"tensor_parallel_size * pipeline_parallel_size (now {model_parallel}) to "
                f"divide the world size {world_size}",
                value=getattr(self, f"{name}_parallel_size"),
            )
        expert_parallel = self.expert_parallel_size * self.etp * self.pipeline_parallel_size
        if world_size % expert_parallel:
            raise ConfigError(
                "parallel.expert_parallel_size",
                "expert_parallel_size * expert_tensor_parallel_size * pipeline_parallel_size "
                f"(now {expert_parallel}) to divide the world size {world_size}",
                value=self.expert_parallel_size,
            )
        return self

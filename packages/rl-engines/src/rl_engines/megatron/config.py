"""`MegatronConfig`: the Megatron engine's parallel layout and options, from one place.

TP/PP/EP sizes come from `rl_core.engine.ParallelConfig` (``tensor_parallel_size``,
``pipeline_parallel_size``, ``expert_parallel_size``); the Megatron-only options come from
``EngineConfig.engine_kwargs`` (keys are the field names below). `from_engine_config`
merges both and checks them (`rl_core.config`); `validate` checks the layout against the
world size. Errors are `ConfigError`s naming the field, its value and what was expected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rl_core.config import ConfigError, build, check
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
        """The sizes from ``config.parallel``, the rest from ``config.engine_kwargs``;
        errors name ``engine_kwargs.<key>`` (or ``parallel.<key>``)."""
        kwargs = dict(config.engine_kwargs)
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "expert_parallel_size"):
            check(name not in kwargs, f"engine_kwargs.{name}", kwargs.get(name),
                  f"no value here: set parallel.{name} (one place for each size)")  # fmt: skip
            kwargs[name] = getattr(config.parallel, name)
        return build(cls, kwargs, "engine_kwargs")

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

    def check(self) -> None:
        for name in ("context_parallel_size", "logits_chunk_tokens"):
            value = getattr(self, name)
            check(value >= 1, name, value, "an integer >= 1")
        for name in ("virtual_pipeline_size", "expert_tensor_parallel_size"):
            value = getattr(self, name)
            check(value is None or value >= 1, name, value, "null or an integer >= 1")
        check(self.virtual_pipeline_size in (None, 1) or self.pipeline_parallel_size > 1,
              "virtual_pipeline_size", self.virtual_pipeline_size,
              "null unless parallel.pipeline_parallel_size > 1")  # fmt: skip
        check(not self.sequence_parallel or self.tensor_parallel_size > 1, "sequence_parallel",
              self.sequence_parallel, "false when parallel.tensor_parallel_size == 1")  # fmt: skip
        coeff = self.moe_aux_loss_coeff
        check(coeff is None or coeff >= 0, "moe_aux_loss_coeff", coeff, "null or a number >= 0")
        check(self.context_parallel_size == 1, "context_parallel_size",
              self.context_parallel_size,
              "1: megatron-core's context parallelism needs Transformer Engine's attention "
              "(TEDotProductAttention), which this engine does not use")  # fmt: skip

    def validate(self, world_size: int, device_type: str) -> MegatronConfig:
        """Check the layout against ``world_size`` ranks on ``device_type``."""
        check(self.moe_token_dispatcher != "alltoall" or device_type != "cpu",
              "engine_kwargs.moe_token_dispatcher", self.moe_token_dispatcher,
              "'allgather' on CPU (megatron-core's alltoall needs CUDA)")  # fmt: skip
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

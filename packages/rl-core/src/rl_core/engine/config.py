"""Typed configs of a training engine: model, optimizer, parallelism, micro-batching.

Every field is validated by ``validate()``, which raises ``ValueError`` naming the field,
its value and what was expected. `EngineConfig.from_dict` builds the nested dataclasses
from plain dicts (YAML/OmegaConf) and rejects unknown keys.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from rl_core.config import dataclass_from_dict
from rl_core.config import is_int as _is_int
from rl_core.config import is_real as _is_real

__all__ = [
    "EngineConfig",
    "LoRAConfig",
    "MicroBatchConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ParallelConfig",
]

DTYPES = ("float32", "bfloat16", "float16")
LR_SCHEDULES = ("constant", "cosine")
ON_NAN = ("raise", "skip")


def _bad(obj: Any, name: str, expected: str) -> ValueError:
    return ValueError(
        f"{type(obj).__name__}.{name}={getattr(obj, name)!r} is invalid: expected {expected}"
    )


@dataclass
class LoRAConfig:
    """Low-rank adapters (LoRA, Hu et al. 2021) instead of full fine-tuning.

    Each targeted linear layer ``W`` becomes ``W + (alpha / rank) * B @ A`` with trainable
    ``A`` [rank, in] and ``B`` [out, rank] (``B`` starts at zero); ``W`` stays frozen.
    ``target_modules``: module names (e.g. ``["q_proj", "v_proj"]``) or ``["all-linear"]``
    (every linear layer but the output head). ``dropout`` applies to the adapter's input.
    """

    rank: int = 8
    alpha: float = 16.0
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    dropout: float = 0.0

    def validate(self) -> LoRAConfig:
        if not _is_int(self.rank) or self.rank < 1:
            raise _bad(self, "rank", "an integer >= 1")
        if not _is_real(self.alpha) or self.alpha <= 0:
            raise _bad(self, "alpha", "a number > 0")
        targets = self.target_modules
        if not (
            isinstance(targets, list | tuple)
            and targets
            and all(isinstance(t, str) and t for t in targets)
            and ("all-linear" not in targets or len(targets) == 1)
        ):
            raise _bad(self, "target_modules", "['all-linear'] or a non-empty list of module names")
        if not _is_real(self.dropout) or not 0 <= self.dropout < 1:
            raise _bad(self, "dropout", "a number in [0, 1)")
        return self

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


@dataclass
class ModelConfig:
    """Which model to train and in which precision.

    Exactly one of ``path`` (a Hugging Face model directory) and ``config`` (a Hugging Face
    config as a dict with ``model_type``; weights initialised randomly from ``seed``) is set.
    ``dtype`` is the dtype of the master weights and optimizer state; ``compute_dtype`` the
    dtype forward/backward run in ("auto": bfloat16 on accelerators, float32 on CPU);
    gradients are reduced in ``reduce_dtype``. ``value_head`` builds a value model (a scalar
    head per token) instead of a causal LM: the role of the model (critic, reward model),
    which every engine honours. How a backend runs the model (attention kernel, padding
    removal, ...) is its own option, in ``EngineConfig.engine_kwargs``.
    ``override_config`` updates the Hugging Face config before the model is built.
    ``freeze_vision_tower`` keeps a vision-language model's vision encoder fixed (no
    gradients, not in the optimizer); False trains it with the rest.
    """

    path: str | None = None
    config: dict[str, Any] | None = None
    dtype: str = "float32"
    compute_dtype: str = "auto"
    reduce_dtype: str = "float32"
    trust_remote_code: bool = False
    value_head: bool = False
    override_config: dict[str, Any] = field(default_factory=dict)
    freeze_vision_tower: bool = False
    lora: LoRAConfig | None = None

    def validate(self) -> ModelConfig:
        if (self.path is None) == (self.config is None):
            raise ValueError(
                f"ModelConfig: path={self.path!r}, config={'<dict>' if self.config else None}: "
                "expected exactly one of them (a model directory or a config dict)"
            )
        if self.path is not None and (not isinstance(self.path, str) or not self.path):
            raise _bad(self, "path", "a non-empty path to a Hugging Face model directory")
        if self.config is not None and (
            not isinstance(self.config, dict) or "model_type" not in self.config
        ):
            raise _bad(self, "config", "a Hugging Face config dict with a 'model_type' key")
        if self.dtype not in DTYPES:
            raise _bad(self, "dtype", f"one of {DTYPES}")
        if self.compute_dtype not in (*DTYPES, "auto"):
            raise _bad(self, "compute_dtype", f"'auto' or one of {DTYPES}")
        if self.reduce_dtype not in DTYPES:
            raise _bad(self, "reduce_dtype", f"one of {DTYPES}")
        if not isinstance(self.override_config, dict):
            raise _bad(self, "override_config", "a dict of Hugging Face config fields")
        if not isinstance(self.freeze_vision_tower, bool):
            raise _bad(self, "freeze_vision_tower", "True or False")
        if isinstance(self.lora, dict):
            self.lora = dataclass_from_dict(LoRAConfig, self.lora, "ModelConfig.lora")
        if self.lora is not None:
            if not isinstance(self.lora, LoRAConfig):
                raise _bad(self, "lora", "None or a LoRAConfig (rank, alpha, target_modules, ...)")
            if self.value_head:
                raise _bad(self, "lora", "None for a value model (LoRA trains causal LMs here)")
            self.lora.validate()
        return self


@dataclass
class OptimizerConfig:
    """AdamW with global-norm gradient clipping and a warm-up + constant/cosine LR schedule.

    The learning rate of optimizer step ``s`` (0-based) is ``lr * factor(s)``: during
    warm-up (``s < W``) ``factor = (s + 1) / W``; afterwards 1 ("constant") or a cosine
    from 1 down to ``min_lr_ratio`` at ``total_steps`` ("cosine"). ``W`` is
    ``warmup_steps``, or ``int(warmup_ratio * total_steps)`` when ``warmup_steps`` is 0.
    ``grad_clip`` None or 0 disables clipping (the norm is still reported).
    """

    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float | None = 1.0
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    min_lr_ratio: float = 0.0
    total_steps: int | None = None

    def validate(self) -> OptimizerConfig:
        if not _is_real(self.lr) or self.lr < 0:
            raise _bad(self, "lr", "a finite number >= 0")
        if not _is_real(self.weight_decay) or self.weight_decay < 0:
            raise _bad(self, "weight_decay", "a finite number >= 0")
        betas = tuple(self.betas) if isinstance(self.betas, (list, tuple)) else None
        if betas is None or len(betas) != 2 or not all(_is_real(b) and 0 <= b < 1 for b in betas):
            raise _bad(self, "betas", "two numbers in [0, 1)")
        self.betas = (float(betas[0]), float(betas[1]))
        if not _is_real(self.eps) or self.eps <= 0:
            raise _bad(self, "eps", "a number > 0")
        if self.grad_clip is not None and (not _is_real(self.grad_clip) or self.grad_clip < 0):
            raise _bad(self, "grad_clip", "None (no clipping) or a number >= 0")
        if self.lr_schedule not in LR_SCHEDULES:
            raise _bad(self, "lr_schedule", f"one of {LR_SCHEDULES}")
        if not _is_int(self.warmup_steps) or self.warmup_steps < 0:
            raise _bad(self, "warmup_steps", "an integer >= 0")
        if not _is_real(self.warmup_ratio) or not 0 <= self.warmup_ratio < 1:
            raise _bad(self, "warmup_ratio", "a number in [0, 1)")
        if not _is_real(self.min_lr_ratio) or not 0 <= self.min_lr_ratio <= 1:
            raise _bad(self, "min_lr_ratio", "a number in [0, 1]")
        if self.total_steps is not None and (not _is_int(self.total_steps) or self.total_steps < 1):
            raise _bad(self, "total_steps", "None or an integer >= 1")
        needs_total = self.lr_schedule == "cosine" or (
            self.warmup_steps == 0 and self.warmup_ratio > 0
        )
        if needs_total and self.total_steps is None:
            raise _bad(
                self, "total_steps", "an integer >= 1 (required by a cosine schedule/warmup_ratio)"
            )
        return self

    @property
    def num_warmup_steps(self) -> int:
        if self.warmup_steps > 0:
            return self.warmup_steps
        if self.warmup_ratio > 0 and self.total_steps:
            return int(self.warmup_ratio * self.total_steps)
        return 0

    def lr_factor(self, step: int) -> float:
        """Multiplier of ``lr`` for optimizer step ``step`` (0-based)."""
        warmup = self.num_warmup_steps
        if step < warmup:
            return (step + 1) / warmup
        if self.lr_schedule == "constant":
            return 1.0
        assert self.total_steps is not None
        progress = min(1.0, (step - warmup) / max(1, self.total_steps - warmup))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine


@dataclass
class ParallelConfig:
    """How the world is laid out.

    Data parallelism covers every rank left after tensor/pipeline parallelism. Inside it,
    ``fsdp_size`` ranks shard parameters, gradients and optimizer state (-1: all of them)
    and ``replicate_size`` groups of them replicate (hybrid sharding, HSDP; -1: derived).
    ``tensor_parallel_size``/``pipeline_parallel_size``/``expert_parallel_size`` are for
    engines that implement them (an engine rejects sizes it does not support).
    ``activation_checkpointing`` recomputes layer activations in backward; ``cpu_offload``
    keeps sharded parameters, gradients and optimizer state in host memory (accelerators).
    ``reshard_after_forward`` frees each layer's gathered parameters after its forward and
    gathers them again in backward (less memory, more communication); None: an engine's
    default (the fsdp engine: True when parameters are sharded over more than one rank).
    """

    fsdp_size: int = -1
    replicate_size: int = -1
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    expert_parallel_size: int = 1
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    reshard_after_forward: bool | None = None

    def validate(self) -> ParallelConfig:
        for name in ("fsdp_size", "replicate_size"):
            value = getattr(self, name)
            if not _is_int(value) or (value != -1 and value < 1):
                raise _bad(self, name, "-1 (derived) or an integer >= 1")
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "expert_parallel_size"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise _bad(self, name, "an integer >= 1")
        if not (self.reshard_after_forward is None or isinstance(self.reshard_after_forward, bool)):
            raise _bad(self, "reshard_after_forward", "true, false or null (engine default)")
        return self

    def dp_layout(self, world_size: int) -> tuple[int, int]:
        """(replicate_size, fsdp_size) for ``world_size`` ranks; raises if they do not fit."""
        model_parallel = (
            self.tensor_parallel_size * self.pipeline_parallel_size
        )  # expert parallel folds into data parallel ranks
        if world_size % model_parallel:
            raise ValueError(
                f"ParallelConfig: world size {world_size} is not divisible by "
                f"tensor_parallel_size * pipeline_parallel_size = {model_parallel}"
            )
        dp = world_size // model_parallel
        shard, rep = self.fsdp_size, self.replicate_size
        if shard == -1 and rep == -1:
            shard, rep = dp, 1
        elif shard == -1:
            shard = dp // rep if dp % rep == 0 else -1
        elif rep == -1:
            rep = dp // shard if dp % shard == 0 else -1
        if shard < 1 or rep < 1 or shard * rep != dp:
            raise ValueError(
                f"ParallelConfig: fsdp_size={self.fsdp_size}, replicate_size="
                f"{self.replicate_size} do not fit {dp} data-parallel ranks: expected "
                "fsdp_size * replicate_size == data-parallel size"
            )
        return rep, shard


@dataclass
class MicroBatchConfig:
    """How a batch is cut into micro-batches (gradients accumulate over them).

    Set at most one: ``micro_batch_size`` (sequences per micro-batch) or
    ``max_tokens_per_micro_batch`` (a token budget: sequences are packed by their real
    length, largest first). Neither: the whole local batch is one micro-batch. All
    data-parallel ranks run the same number of micro-batches (the largest any rank needs).
    """

    micro_batch_size: int | None = None
    max_tokens_per_micro_batch: int | None = None

    def validate(self) -> MicroBatchConfig:
        if self.micro_batch_size is not None and self.max_tokens_per_micro_batch is not None:
            raise ValueError(
                f"MicroBatchConfig: micro_batch_size={self.micro_batch_size} and "
                f"max_tokens_per_micro_batch={self.max_tokens_per_micro_batch}: expected at "
                "most one of them"
            )
        for name in ("micro_batch_size", "max_tokens_per_micro_batch"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise _bad(self, name, "None or an integer >= 1")
        return self


@dataclass
class EngineConfig:
    """Everything a training engine is built from.

    ``infer_micro_batch`` (None: same as ``micro_batch``) cuts `infer_batch` inputs.
    ``inference_only``: a model that is never trained (a reference policy, a reward
    model): no optimizer, no optimizer state, no gradients; `train_batch` raises.
    ``on_nan``: what a non-finite loss or gradient norm does: "raise" (FloatingPointError)
    or "skip" (drop the step: no optimizer/scheduler step; metrics say ``skipped=1``);
    either way parameters never take a non-finite update. ``timeout_s`` bounds every
    collective. ``engine_kwargs``: the backend's own options (e.g. the fsdp engine's
    ``attn_implementation``, ``use_remove_padding``, ``logprob_chunk_tokens``; the megatron
    engine's ``sequence_parallel``), which the engine validates into its own typed options.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimizerConfig = field(default_factory=OptimizerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    micro_batch: MicroBatchConfig = field(default_factory=MicroBatchConfig)
    infer_micro_batch: MicroBatchConfig | None = None
    inference_only: bool = False
    seed: int = 0
    on_nan: Literal["raise", "skip"] = "raise"
    timeout_s: float = 600.0
    engine_kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> EngineConfig:
        self.model.validate()
        self.optim.validate()
        self.parallel.validate()
        self.micro_batch.validate()
        if self.infer_micro_batch is not None:
            self.infer_micro_batch.validate()
        if not isinstance(self.inference_only, bool):
            raise _bad(self, "inference_only", "true or false")
        if not _is_int(self.seed) or self.seed < 0:
            raise _bad(self, "seed", "an integer >= 0")
        if self.on_nan not in ON_NAN:
            raise _bad(self, "on_nan", f"one of {ON_NAN}")
        if not _is_real(self.timeout_s) or self.timeout_s <= 0:
            raise _bad(self, "timeout_s", "a number of seconds > 0")
        if not isinstance(self.engine_kwargs, dict):
            raise _bad(self, "engine_kwargs", "a dict of backend-specific options")
        return self

    @property
    def infer_micro_batch_config(self) -> MicroBatchConfig:
        return self.infer_micro_batch or self.micro_batch

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineConfig:
        """Build from nested plain dicts (e.g. ``OmegaConf.to_container``); unknown keys raise."""
        return dataclass_from_dict(cls, data, "EngineConfig")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

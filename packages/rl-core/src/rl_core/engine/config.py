"""Typed configs of a training engine: model, optimizer, parallelism, micro-batching.

They follow rl_core.config: field types come from the annotations, the rules between
values live in each class's ``check()``, and every error is a `ConfigError` with the
field's dotted path. `EngineConfig.from_dict` builds the nested dataclasses from plain
dicts (YAML/OmegaConf) and rejects unknown keys; ``validate()`` re-checks an object built
in Python and returns it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from rl_core.config import ConfigError, build, check
from rl_core.config import validate as _validate

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


class _Checked:
    """``validate()``: check every field's type and the class's rules; errors name
    ``<ClassName>.<field>``."""

    def validate(self: Any) -> Any:
        return _validate(self, type(self).__name__)


@dataclass
class LoRAConfig(_Checked):
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

    def check(self) -> None:
        check(self.rank >= 1, "rank", self.rank, "an integer >= 1")
        check(self.alpha > 0, "alpha", self.alpha, "a number > 0")
        targets = self.target_modules
        check(
            bool(targets) and all(targets) and ("all-linear" not in targets or len(targets) == 1),
            "target_modules",
            targets,
            "['all-linear'] or a non-empty list of module names",
        )
        check(0 <= self.dropout < 1, "dropout", self.dropout, "a number in [0, 1)")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


@dataclass
class ModelConfig(_Checked):
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
    ``builder``: a model registered under ``rl.models`` (`rl_core.engine.models`, e.g. a VLA
    policy: a VLM with action and value heads) built from ``path`` with
    ``builder_options``; null: the Hugging Face model at ``path`` itself.
    """

    path: str | None = None
    config: dict[str, Any] | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    reduce_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    trust_remote_code: bool = False
    value_head: bool = False
    override_config: dict[str, Any] = field(default_factory=dict)
    freeze_vision_tower: bool = False
    lora: LoRAConfig | None = None
    builder: str | None = None
    builder_options: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        check(self.builder is None or self.path is not None, "builder", self.builder,
              "null unless path names the Hugging Face directory the builder starts from")  # fmt: skip
        if (self.path is None) == (self.config is None):
            raise ConfigError(
                "path",
                "exactly one of path (a model directory) and config (a config dict)",
                problem="conflict" if self.path is not None else "missing",
            )
        check(self.path is None or bool(self.path), "path", self.path,
              "a non-empty path to a Hugging Face model directory")  # fmt: skip
        check(self.config is None or "model_type" in self.config, "config", self.config,
              "a Hugging Face config dict with a 'model_type' key")  # fmt: skip
        check(self.lora is None or not self.value_head, "lora", self.lora,
              "null for a value model (LoRA trains causal LMs here)")  # fmt: skip


@dataclass
class OptimizerConfig(_Checked):
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

    def check(self) -> None:
        check(self.lr >= 0, "lr", self.lr, "a finite number >= 0")
        check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "a finite number >= 0")
        check(all(0 <= b < 1 for b in self.betas), "betas", self.betas, "two numbers in [0, 1)")
        check(self.eps > 0, "eps", self.eps, "a number > 0")
        check(self.grad_clip is None or self.grad_clip >= 0, "grad_clip", self.grad_clip,
              "null (no clipping) or a number >= 0")  # fmt: skip
        check(self.warmup_steps >= 0, "warmup_steps", self.warmup_steps, "an integer >= 0")
        check(0 <= self.warmup_ratio < 1, "warmup_ratio", self.warmup_ratio, "a number in [0, 1)")
        check(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", self.min_lr_ratio, "a number in [0, 1]")
        check(self.total_steps is None or self.total_steps >= 1, "total_steps", self.total_steps,
              "null (a trainer sets it) or an integer >= 1")  # fmt: skip

    @property
    def needs_total_steps(self) -> bool:
        """A cosine schedule or a warm-up ratio needs ``total_steps``."""
        return self.lr_schedule == "cosine" or (self.warmup_steps == 0 and self.warmup_ratio > 0)

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
class ParallelConfig(_Checked):
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

    def check(self) -> None:
        for name in ("fsdp_size", "replicate_size"):
            value = getattr(self, name)
            check(value == -1 or value >= 1, name, value, "-1 (derived) or an integer >= 1")
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "expert_parallel_size"):
            value = getattr(self, name)
            check(value >= 1, name, value, "an integer >= 1")

    def dp_layout(self, world_size: int) -> tuple[int, int]:
        """(replicate_size, fsdp_size) for ``world_size`` ranks; raises if they do not fit."""
        model_parallel = (
            self.tensor_parallel_size * self.pipeline_parallel_size
        )  # expert parallel folds into data parallel ranks
        if world_size % model_parallel:
            raise ConfigError(
                "parallel.tensor_parallel_size",
                f"tensor_parallel_size * pipeline_parallel_size = {model_parallel} to divide "
                f"the world size {world_size}",
                value=self.tensor_parallel_size,
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
            raise ConfigError(
                "parallel.fsdp_size",
                f"fsdp_size * replicate_size (replicate_size={self.replicate_size}) == the "
                f"{dp} data-parallel ranks",
                value=self.fsdp_size,
            )
        return rep, shard


@dataclass
class MicroBatchConfig(_Checked):
    """How a batch is cut into micro-batches (gradients accumulate over them).

    Set at most one: ``micro_batch_size`` (sequences per micro-batch) or
    ``max_tokens_per_micro_batch`` (a token budget: sequences are packed by their real
    length, largest first). Neither: the whole local batch is one micro-batch. All
    data-parallel ranks run the same number of micro-batches (the largest any rank needs).
    """

    micro_batch_size: int | None = None
    max_tokens_per_micro_batch: int | None = None

    def check(self) -> None:
        for name in ("micro_batch_size", "max_tokens_per_micro_batch"):
            value = getattr(self, name)
            check(value is None or value >= 1, name, value, "null or an integer >= 1")
        check(
            self.micro_batch_size is None or self.max_tokens_per_micro_batch is None,
            "max_tokens_per_micro_batch",
            self.max_tokens_per_micro_batch,
            f"null when micro_batch_size is set ({self.micro_batch_size}): at most one of them",
        )


@dataclass
class EngineConfig(_Checked):
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
    ``router_replay`` (mixture-of-experts models only): every forward pass routes each token
    to the experts the batch's ``routed_experts`` field records (the rollout's choice, see
    `rl_core.rollout.ROUTED_EXPERTS`) instead of the router's own top-k; tokens recorded as
    -1 keep the router's choice. A batch without the field is refused.
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
    router_replay: bool = False

    def check(self) -> None:
        optim = self.optim
        check(not optim.needs_total_steps or optim.total_steps is not None, "optim.total_steps",
              None, "an integer >= 1 (required by a cosine schedule or warmup_ratio)")  # fmt: skip
        check(self.seed >= 0, "seed", self.seed, "an integer >= 0")
        check(self.timeout_s > 0, "timeout_s", self.timeout_s, "a number of seconds > 0")

    @property
    def infer_micro_batch_config(self) -> MicroBatchConfig:
        return self.infer_micro_batch or self.micro_batch

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineConfig:
        """Build from nested plain dicts (e.g. ``OmegaConf.to_container``); unknown keys raise."""
        return build(cls, data, "EngineConfig")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

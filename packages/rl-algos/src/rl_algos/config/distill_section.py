"""The ``distill`` section: on-policy distillation from a teacher model (README "On-policy
distillation").

The student samples; the teacher, an inference-only model, gives the log-prob of every
sampled token. The per-token reverse KL ``log pi_student(y_t) - log pi_teacher(y_t)`` is
trained as a dense advantage (``mode: advantage``, Thinking Machines' on-policy
distillation) or as a KL loss term (``mode: loss``, verl's ``kl_loss_type`` names).

Context distillation (``teacher_prompt_key``): the teacher reads each response after a
prompt of its own, a column of the training rows, while the student trains on its plain
prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rl_algos.kl import KL_TYPES
from rl_core.config import check
from rl_core.engine.config import ParallelConfig

__all__ = ["DistillConfig"]


@dataclass
class DistillConfig:
    """On-policy distillation (see the module docstring): the reverse KL to a teacher,
    trained as a per-token advantage or as a loss term."""

    teacher_path: str | None = None
    """The teacher model (any reference `model.path` takes; a different architecture and
    size are fine, the vocabulary must be the policy's or `token_map` set); null: no
    distillation."""
    teacher_engine: str = "fsdp"
    """The inference-only engine that runs the teacher (with the actor's micro-batching)."""
    placement: Literal["split", "colocated"] = "split"
    """`split`: a worker group of `num_workers` processes on a pool of its own;
    `colocated`: a role in the actor's processes (`num_workers` is the actor's)."""
    num_workers: int = 1
    """The teacher's processes (placement split; CPUs/devices per process: the trainer's)."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """The teacher's weights and compute dtype (null: `model.dtype` / `model.compute_dtype`)."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """The teacher's parallel layout over its processes (the engine's `parallel`)."""
    teacher_engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """The teacher engine's own options (checked by the engine it names)."""
    coef: float = 1.0
    """Weight of the reverse KL (against the task advantage, or in the loss)."""
    mode: Literal["advantage", "loss"] = "advantage"
    """`advantage`: -coef x (log pi_old - log pi_teacher) is added to each token's
    advantage; `loss`: coef x kl(log pi, log pi_teacher) is added to the actor loss."""
    kl_type: str = "k2"
    """The KL estimator of the `loss` mode (k2 / mse: its gradient on the student's samples
    is the reverse KL's; k1, k3 / low_var_kl, k3+ ...)."""

    teacher_prompt_key: str | None = None
    """A prompt column of the training rows that the teacher reads instead of the
    student's prompt (context distillation, module docstring); null: the student's."""
    token_map: Literal["by_text"] | None = None
    """A teacher with another tokenizer: `by_text` gives each policy token the teacher's id
    of the same token text (every policy token must be in its vocabulary); null: refused."""

    def __post_init__(self) -> None:
        check(
            self.teacher_prompt_key is None or bool(self.teacher_prompt_key),
            "teacher_prompt_key",
            self.teacher_prompt_key,
            "null or a column name of the training rows",
        )
        check(self.num_workers >= 1, "num_workers", self.num_workers, "an integer >= 1")
        check(self.coef > 0, "coef", self.coef, "> 0 (the weight of the reverse KL)")
        check(
            self.kl_type in KL_TYPES, "kl_type", self.kl_type, f"one of {list(KL_TYPES)}", KL_TYPES
        )

    @property
    def enabled(self) -> bool:
        """Whether a teacher is configured."""
        return self.teacher_path is not None

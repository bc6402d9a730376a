"""The ``distill`` section: on-policy distillation from a teacher model.

The student (the policy) samples; the teacher, an inference-only model like the
reference policy (any architecture and size the engine loads, with the student's exact
vocabulary), gives the log-prob of every sampled token. The per-token reverse KL
KL(student || teacher) is estimated on the student's own tokens,
``log pi_student(y_t) - log pi_teacher(y_t)``, and trained one of two ways:

* ``mode: advantage`` (the default; Thinking Machines' on-policy distillation, slime's
  ``--opd-kl-coef``, prime-rl's ``teacher_tau``): each token's advantage becomes
  ``A_t - coef * (log pi_old(y_t) - log pi_teacher(y_t))``, a dense per-token reward the
  policy loss trains like any advantage; its expected gradient is the reverse KL's.
* ``mode: loss``: ``coef * kl(log pi, log pi_teacher)`` is added to the actor loss, like
  the KL-to-reference loss (verl's ``kl_loss_type`` names: ``k2``/``mse``, whose gradient
  on the student's samples is the reverse KL's; ``k1``, ``k3``/``low_var_kl``,
  the straight-through ``k3+``...).

Alone (``reward.rule_based: false`` and no reward model or judge: every task reward is 0)
or mixed with a task reward (the estimator's advantage plus the distillation term).
TRL's GKD (``lmbda``, ``beta``) mixes teacher-generated data and interpolates a full
vocabulary JSD; here the data is always on-policy (GKD's ``lmbda=1``) and the divergence is
the sampled-token reverse KL (GKD's ``beta=1``), which needs only the teacher's log-prob of
each sampled token, not its whole distribution.

    distill:
      teacher_path: Qwen/Qwen2.5-7B-Instruct
      coef: 1.0
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rl_algos.kl import KL_TYPES
from rl_core.config import check

__all__ = ["DistillConfig"]


@dataclass
class DistillConfig:
    """On-policy distillation (see the module docstring). teacher_path: the teacher model
    (any reference ``model.path`` takes; null: no distillation); teacher_engine: the
    inference-only engine that runs it (micro-batching and parallelism as the actor's;
    `teacher_engine_kwargs`: its own options); coef: weight of the reverse KL; mode:
    `advantage` or `loss`; kl_type: the estimator of the `loss` mode."""

    teacher_path: str | None = None
    teacher_engine: str = "fsdp"
    teacher_engine_kwargs: dict[str, Any] = field(default_factory=dict)
    coef: float = 1.0
    mode: Literal["advantage", "loss"] = "advantage"
    kl_type: str = "k2"

    def __post_init__(self) -> None:
        check(self.coef > 0, "coef", self.coef, "> 0 (the weight of the reverse KL)")
        check(
            self.kl_type in KL_TYPES, "kl_type", self.kl_type, f"one of {list(KL_TYPES)}", KL_TYPES
        )

    @property
    def enabled(self) -> bool:
        """Whether a teacher is configured."""
        return self.teacher_path is not None

"""On-policy distillation: the teacher's per-token log-probs in the actor's loss.

The micro-batch carries ``teacher_log_prob`` [b, R] (same temperature as the student's);
the modes are explained in `rl_algos.config.distill_section`.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from rl_algos.aggregation import LossScale, agg_loss
from rl_algos.config.distill_section import DistillConfig
from rl_algos.kl import kl_penalty
from rl_algos.losses import LossFn, PolicyLossConfig, _partial

__all__ = ["TEACHER_LOG_PROB", "full_vocab_reverse_kl", "make_distill_loss_fn"]

TEACHER_LOG_PROB = "teacher_log_prob"


def _with_advantages(micro_batch: Any, advantages: torch.Tensor) -> Any:
    """A shallow copy of the micro-batch whose `advantages` are replaced (the engine's own
    micro-batch, and the mini-batch it was cut from, stay as they were)."""
    shaped = copy.copy(micro_batch)
    shaped.batch = micro_batch.batch.clone(recurse=False)
    shaped.batch.set("advantages", advantages)
    return shaped


def make_distill_loss_fn(
    base_loss_fn: LossFn, config: DistillConfig, loss_config: PolicyLossConfig
) -> LossFn:
    """The actor's loss with the distillation term: `advantage` mode subtracts
    ``coef * (log pi_old - log pi_teacher)`` from the advantages, `loss` mode adds
    ``coef * kl(log pi, log pi_teacher)``. Logs ``distill/reverse_kl`` (k1) and
    ``distill/teacher_log_prob``."""

    def loss_fn(
        outputs: dict[str, torch.Tensor], micro_batch: Any, ctx: Any
    ) -> tuple[torch.Tensor, dict[str, float]]:
        batch = micro_batch.batch
        if TEACHER_LOG_PROB not in set(batch.keys()):
            raise KeyError(
                f"the micro-batch has no {TEACHER_LOG_PROB!r} (needed for distill.teacher_path)"
            )
        teacher = batch[TEACHER_LOG_PROB]
        log_prob = outputs["log_probs"]
        mask = batch["response_mask"].to(log_prob.dtype)
        scale = LossScale.from_context(ctx, loss_config.agg_norm_constant)
        if config.mode == "advantage":
            if micro_batch.meta_info.get("old_log_probs_from_update"):
                old = log_prob.detach()
            else:
                old = batch["old_log_probs"]
            penalty = (old - teacher).detach() * mask
            shaped = batch["advantages"] - config.coef * penalty
            loss, metrics = base_loss_fn(outputs, _with_advantages(micro_batch, shaped), ctx)
        else:
            loss, metrics = base_loss_fn(outputs, micro_batch, ctx)
            kl = agg_loss(
                kl_penalty(log_prob, teacher, config.kl_type), mask, loss_config.agg_mode, scale
            )
            loss = loss + config.coef * kl
            metrics["distill/kl_loss"] = float(kl.detach().item())
        metrics["distill/reverse_kl"] = _partial(log_prob - teacher, mask, scale)
        metrics["distill/teacher_log_prob"] = _partial(teacher, mask, scale)
        return loss, metrics

    return loss_fn


def full_vocab_reverse_kl(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Exact KL(student || teacher) over the vocabulary, mean over ``mask`` positions
    (float64); logits [..., V], a teacher's extra rows cut to the student's V."""
    vocab = student_logits.shape[-1]
    log_s = torch.log_softmax(student_logits.double(), dim=-1)
    log_t = torch.log_softmax(teacher_logits[..., :vocab].double(), dim=-1)
    per_position = (log_s.exp() * (log_s - log_t)).sum(-1)
    weights = mask.double()
    return (per_position * weights).sum() / weights.sum().clamp(min=1.0)

"""Policy and value losses, and the loss functions handed to a TrainEngine.

Policy losses (`POLICY_LOSSES`, entry points ``rl.policy_losses``) take keyword arguments
``log_prob, old_log_prob, advantages, response_mask`` ([b, R]), ``config``, ``scale`` and
``rollout_log_probs`` ([b, R] or None). The loss and every metric are this micro-batch's
partial of the mini-batch value: the engine sums them (see `rl_algos.aggregation`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from rl_algos.aggregation import AGG_MODES, LossScale, agg_loss
from rl_algos.kl import KL_TYPES, kl_penalty
from rl_algos.rollout_correction import (
    RolloutCorrectionConfig,
    importance_weights,
    partial_is_metrics,
)
from rl_core.config import check
from rl_core.registry import Registry

__all__ = [
    "POLICY_LOSSES",
    "LossFn",
    "PolicyLossConfig",
    "PolicyLossFn",
    "ValueLossConfig",
    "compute_gspo_policy_loss",
    "compute_ppo_policy_loss",
    "compute_value_loss",
    "make_actor_loss_fn",
    "make_critic_loss_fn",
]

Result = tuple[torch.Tensor, dict[str, float]]
PolicyLossFn = Callable[..., Result]
LossFn = Callable[[dict[str, torch.Tensor], Any, Any], tuple[torch.Tensor, dict[str, float]]]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("rl.policy_losses", kind="policy loss")


def _check_choice(field: str, value: Any, choices: tuple[str, ...]) -> None:
    """Raise a ConfigError for ``field`` unless ``value`` is one of ``choices``."""
    check(value in choices, field, value, f"one of {list(choices)}", choices)


@dataclass
class PolicyLossConfig:
    """How the actor's loss is computed (also the `actor.loss` section of the config).

    name: policy loss in POLICY_LOSSES (`ppo`, `gspo`, `clip_cov`, `kl_cov`, `gpg`,
        `geo_mean`, `cispo`, `sapo`, `dppo_tv`, `dppo_kl`, `dro`, `reinforce`, or a
        plugin's; see rl_algos.policy_losses for the formulas).
    clip_ratio_low / clip_ratio_high: the ratio is clipped to [1 - low, 1 + high]
        (equal values: classic PPO; a larger high: DAPO's clip-higher). `geo_mean` clips
        the log-ratio to [-low, high]; `dppo_tv` / `dppo_kl` read them as the divergence
        thresholds of their trust region.
    clip_ratio_c: dual-clip bound on the loss of negative-advantage tokens (> 1); the
        truncation of the importance weight in `dppo_tv` / `dppo_kl`.
    clip_cov_ratio / clip_cov_lb / clip_cov_ub: Clip-Cov: the share of tokens whose
        gradient is detached, drawn among those with covariance in (lb, ub).
    kl_cov_ratio / ppo_kl_coef: KL-Cov: the share of tokens with the largest covariance
        that get the penalty ppo_kl_coef * |log pi - log pi_old|.
    dro_beta: DRO: weight of the quadratic penalty 0.5 * beta * (log pi - log pi_old)^2.
    tau_pos / tau_neg: SAPO: temperatures of the soft gate for positive / non-positive
        advantages.
    agg_mode / agg_norm_constant: loss aggregation (see rl_algos.aggregation); the
        constant is used by `seq-mean-token-sum-norm` (None: the maximum response length).
    entropy_coeff: weight of the entropy bonus (subtracted from the loss).
    kl_loss_coef / kl_loss_type: KL to the reference as a loss term (0: off).
    rollout_correction: the off-policy correction against the policy that generated the
        tokens (verl's rollout correction: importance weights, rejection, the veto; see
        rl_algos.rollout_correction). The one setting for it: truncated IS (TIS) is
        `{rollout_is: token, rollout_is_threshold: CAP}`, AReaL's decoupled PPO
        `{rollout_is: token, rollout_is_threshold: "0_CAP"}`. null: none, or decoupled PPO
        with cap 2 when async.max_staleness > 0 (an explicit `{}` turns that off).
    """

    name: str = "ppo"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    agg_mode: str = "token-mean"
    agg_norm_constant: float | None = None
    entropy_coeff: float = 0.0
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "k3"
    rollout_correction: RolloutCorrectionConfig | None = None
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    dro_beta: float = 0.1
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    RENAMED: ClassVar[dict[str, str]] = {
        "tis_cap": "rollout_correction: {rollout_is: token, rollout_is_threshold: CAP}",
        "behav_imp_weight_cap": 'rollout_correction: {rollout_is: token, rollout_is_threshold: "0_CAP"}',
    }

    def __post_init__(self) -> None:
        check(
            self.clip_ratio_low >= 0,
            "clip_ratio_low",
            self.clip_ratio_low,
            ">= 0 (>= 1: no lower bound on the ratio, as CISPO uses)",
        )
        check(self.clip_ratio_high >= 0, "clip_ratio_high", self.clip_ratio_high, ">= 0")
        check(self.clip_ratio_c > 1, "clip_ratio_c", self.clip_ratio_c, "> 1 (dual-clip)")
        _check_choice("agg_mode", self.agg_mode, AGG_MODES)
        check(self.kl_loss_coef >= 0, "kl_loss_coef", self.kl_loss_coef, ">= 0")
        _check_choice("kl_loss_type", self.kl_loss_type, KL_TYPES)
        for name in ("clip_cov_ratio", "kl_cov_ratio"):
            value = getattr(self, name)
            check(0 < value <= 1, name, value, "a share of tokens in (0, 1]")
        check(
            self.clip_cov_lb < self.clip_cov_ub,
            "clip_cov_lb",
            self.clip_cov_lb,
            f"< clip_cov_ub={self.clip_cov_ub} (the covariance window is (lb, ub))",
        )
        check(self.ppo_kl_coef >= 0, "ppo_kl_coef", self.ppo_kl_coef, ">= 0")
        check(self.dro_beta > 0, "dro_beta", self.dro_beta, "> 0")
        for name in ("tau_pos", "tau_neg"):
            value = getattr(self, name)
            check(value > 0, name, value, "> 0 (a gate temperature)")


def _off_policy_weights(
    old_log_prob: torch.Tensor,
    rollout_log_probs: torch.Tensor | None,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
) -> torch.Tensor | None:
    """Per-token rollout-correction IS weights (no gradient); None when off."""
    correction = config.rollout_correction
    if correction is None or correction.rollout_is is None:
        return None
    if rollout_log_probs is None:
        raise ValueError(
            "actor.loss.rollout_correction.rollout_is is set but the batch has no "
            "'rollout_log_probs'"
        )
    return importance_weights(old_log_prob, rollout_log_probs, response_mask, correction)


def _partial(value: torch.Tensor, mask: torch.Tensor, scale: LossScale) -> float:
    """This micro-batch's share of a token mean over the mini-batch."""
    return float((value.detach() * mask).sum().item()) / max(scale.global_num_tokens, 1)


def _log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    return (log_prob - old_log_prob).clamp(-20.0, 20.0)


def _finish(
    pg_losses: torch.Tensor,
    mask: torch.Tensor,
    log_ratio: torch.Tensor,
    config: PolicyLossConfig,
    scale: LossScale,
    weights: torch.Tensor | None,
    extra: dict[str, torch.Tensor] | None = None,
    constant: dict[str, float] | None = None,
) -> Result:
    """Weight, aggregate and add partial metrics: `extra` per-token values (token mean),
    `constant` metrics verl reports as 0; ``actor/ppo_kl`` is the mean of ``-log_ratio``."""
    if weights is not None:
        pg_losses = pg_losses * weights
    loss = agg_loss(pg_losses, mask, config.agg_mode, scale)
    metrics = {
        "actor/pg_loss": float(loss.detach().item()),
        "actor/ppo_kl": _partial(-log_ratio, mask, scale),
    }
    for name, value in (extra or {}).items():
        metrics[name] = _partial(value.float(), mask, scale)
    metrics.update(constant or {})
    return loss, metrics


def compute_ppo_policy_loss(
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    scale: LossScale,
    rollout_log_probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with decoupled clip ranges and dual-clip (Ye et al. 2020):
    for negative advantages the loss is further capped at -A * clip_ratio_c."""
    mask = response_mask.to(log_prob.dtype)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1 - config.clip_ratio_low, 1 + config.clip_ratio_high)
    clip_loss = torch.maximum(loss_unclipped, loss_clipped)
    dual_bound = -advantages * config.clip_ratio_c
    pg_losses = torch.where(advantages < 0, torch.minimum(clip_loss, dual_bound), clip_loss)
    weights = _off_policy_weights(old_log_prob, rollout_log_probs, response_mask, config)
    clipfrac = {
        "actor/pg_clipfrac": loss_clipped > loss_unclipped,
        "actor/pg_clipfrac_lower": (clip_loss > dual_bound) & (advantages < 0),
    }
    return _finish(pg_losses, mask, log_ratio, config, scale, weights, clipfrac)


def compute_gspo_policy_loss(
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    scale: LossScale,
    rollout_log_probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: one ratio per sequence, s = exp(mean_t log pi/pi_old), clipped to [1-low, 1+high],
    written per token as sg(s) * pi_t / sg(pi_t) (value s, gradient s * grad log pi_t)."""
    mask = response_mask.to(log_prob.dtype)
    lengths = mask.sum(dim=-1).clamp(min=1)
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = (log_ratio * mask).sum(dim=-1) / lengths
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = token_log_ratio.clamp(max=10.0).exp()
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1 - config.clip_ratio_low, 1 + config.clip_ratio_high)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    weights = _off_policy_weights(old_log_prob, rollout_log_probs, response_mask, config)
    clipfrac = {"actor/pg_clipfrac": loss_clipped > loss_unclipped}
    no_dual_clip = {"actor/pg_clipfrac_lower": 0.0}  # as verl: GSPO has no dual clip
    return _finish(pg_losses, mask, log_ratio, config, scale, weights, clipfrac, no_dual_clip)


@dataclass
class ValueLossConfig:
    """The critic's loss (the `critic.loss` section of the config): squared error with the
    new value clipped to within `cliprange_value` of the old one (PPO's value clipping)."""

    cliprange_value: float = 0.5
    agg_mode: str = "token-mean"
    agg_norm_constant: float | None = None

    def __post_init__(self) -> None:
        check(self.cliprange_value > 0, "cliprange_value", self.cliprange_value, "> 0")
        _check_choice("agg_mode", self.agg_mode, AGG_MODES)


def compute_value_loss(
    vpreds: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    agg_mode: str,
    scale: LossScale,
) -> tuple[torch.Tensor, dict[str, float]]:
    """0.5 * max((v - R)^2, (clip(v, v_old +- c) - R)^2), aggregated."""
    mask = response_mask.to(vpreds.dtype)
    clipped = values + (vpreds - values).clamp(-cliprange_value, cliprange_value)
    loss_unclipped = (vpreds - returns).square()
    loss_clipped = (clipped - returns).square()
    loss = 0.5 * agg_loss(torch.maximum(loss_unclipped, loss_clipped), mask, agg_mode, scale)
    metrics = {
        "critic/vf_loss": float(loss.detach().item()),
        "critic/vf_clipfrac": _partial((loss_clipped > loss_unclipped).float(), mask, scale),
        "critic/vpred_mean": _partial(vpreds, mask, scale),
    }
    return loss, metrics


def _field(batch: Any, key: str, why: str) -> torch.Tensor:
    if key not in set(batch.keys()):  # older TensorDicts refuse `key in td`
        raise KeyError(f"the micro-batch has no {key!r} (needed for {why})")
    return batch[key]


def make_actor_loss_fn(config: PolicyLossConfig) -> LossFn:
    """The actor's loss for `TrainEngine.train_batch`: policy loss - entropy bonus + KL term.

    With ``meta_info["old_log_probs_from_update"]`` (one optimizer step on fresh samples) the
    batch has no `old_log_probs`: the update's own log-probs, detached, stand in."""
    policy_loss = POLICY_LOSSES.get(config.name)

    def loss_fn(
        outputs: dict[str, torch.Tensor], micro_batch: Any, ctx: Any
    ) -> tuple[torch.Tensor, dict[str, float]]:
        batch = micro_batch.batch
        mask = _field(batch, "response_mask", "the loss mask")
        scale = LossScale.from_context(ctx, config.agg_norm_constant)
        log_prob = outputs["log_probs"]
        correction = config.rollout_correction
        weighted = correction is not None and correction.rollout_is is not None
        if weighted:
            rollout = _field(batch, "rollout_log_probs", "actor.loss.rollout_correction")
        else:  # the behaviour policy's log-probs when the rollout sent them (reinforce's KL)
            present = "rollout_log_probs" in set(batch.keys())  # older TensorDicts refuse `in`
            rollout = batch["rollout_log_probs"] if present else None
        from_update = bool(micro_batch.meta_info.get("old_log_probs_from_update"))
        if from_update:
            old_log_prob = log_prob.detach()  # the proximal policy of decoupled PPO too
        else:
            old_log_prob = _field(batch, "old_log_probs", "the importance ratio")
        loss, metrics = policy_loss(
            log_prob=log_prob,
            old_log_prob=old_log_prob,
            advantages=_field(batch, "advantages", "the policy gradient"),
            response_mask=mask,
            config=config,
            scale=scale,
            rollout_log_probs=rollout,
        )
        if weighted and from_update:  # else the driver reported them on the whole batch
            counts = (scale.global_num_tokens, scale.global_num_seqs)
            metrics.update(partial_is_metrics(old_log_prob, rollout, mask, correction, *counts))
        if "entropy" in outputs:
            entropy = agg_loss(outputs["entropy"], mask, config.agg_mode, scale)
            metrics["actor/entropy"] = _partial(outputs["entropy"], mask, scale)
            if config.entropy_coeff != 0:
                loss = loss - config.entropy_coeff * entropy
        elif config.entropy_coeff != 0:
            raise KeyError("loss.entropy_coeff is set but the engine returned no 'entropy'")
        if config.kl_loss_coef > 0:
            ref = _field(batch, "ref_log_prob", "loss.kl_loss_coef")
            kl = agg_loss(
                kl_penalty(log_prob, ref, config.kl_loss_type), mask, config.agg_mode, scale
            )
            loss = loss + config.kl_loss_coef * kl
            metrics["actor/kl_loss"] = float(kl.detach().item())
        return loss, metrics

    return loss_fn


def make_critic_loss_fn(config: ValueLossConfig) -> LossFn:
    """The critic's clipped value loss for `TrainEngine.train_batch`."""

    def loss_fn(
        outputs: dict[str, torch.Tensor], micro_batch: Any, ctx: Any
    ) -> tuple[torch.Tensor, dict[str, float]]:
        batch = micro_batch.batch
        return compute_value_loss(
            vpreds=outputs["values"],
            values=_field(batch, "values", "value clipping"),
            returns=_field(batch, "returns", "the value target"),
            response_mask=_field(batch, "response_mask", "the loss mask"),
            cliprange_value=config.cliprange_value,
            agg_mode=config.agg_mode,
            scale=LossScale.from_context(ctx, config.agg_norm_constant),
        )

    return loss_fn

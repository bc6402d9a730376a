"""Policy losses beyond PPO and GSPO, with verl's names and `rl_algos.losses`' convention.

Notation per token: ``r = pi / pi_old`` (log-ratio clamped to [-20, 20]), ``A`` the
advantage, ``sg`` stop-gradient, ``eps_low`` / ``eps_high`` = ``clip_ratio_low`` / ``_high``.
Per-token losses are weighted by the rollout correction when set and aggregated with
``agg_mode`` (``geo_mean`` is sequence-level). Clip-Cov and KL-Cov pick tokens within the
micro-batch, as the reference does; Clip-Cov draws them from the global torch RNG.
"""

from __future__ import annotations

import torch

from rl_algos.aggregation import LossScale
from rl_algos.losses import (
    PolicyLossConfig,
    Result,
    _finish,
    _log_ratio,
    _off_policy_weights,
    _partial,
)
from rl_algos.masked import masked_mean

__all__ = [
    "compute_cispo_policy_loss",
    "compute_clip_cov_policy_loss",
    "compute_dppo_kl_policy_loss",
    "compute_dppo_tv_policy_loss",
    "compute_dro_policy_loss",
    "compute_geo_mean_policy_loss",
    "compute_gpg_policy_loss",
    "compute_kl_cov_policy_loss",
    "compute_reinforce_policy_loss",
    "compute_sapo_policy_loss",
]


def _covariance(
    advantages: torch.Tensor, log_prob: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """Per-token (A - mean A)(log pi - mean log pi) over the valid tokens; no gradient."""
    mask = valid.to(log_prob.dtype)
    adv = advantages.detach()
    logp = log_prob.detach()
    return (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp, mask))


def compute_clip_cov_policy_loss(
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    scale: LossScale,
    rollout_log_probs: torch.Tensor | None = None,
) -> Result:
    """Clip-Cov (Cui et al. 2025, arXiv:2505.22617): PPO's clipped loss, except that
    ``max(1, floor(clip_cov_ratio * valid))`` tokens, drawn at random among the unclipped
    ones with covariance in ``(clip_cov_lb, clip_cov_ub)``, get a loss of 0."""
    mask = response_mask.to(log_prob.dtype)
    valid = response_mask.bool()
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1 - config.clip_ratio_low, 1 + config.clip_ratio_high)
    clipped = (loss_clipped > loss_unclipped) & valid
    cov = _covariance(advantages, log_prob, valid)
    window = valid & ~clipped & (cov > config.clip_cov_lb) & (cov < config.clip_cov_ub)
    candidates = torch.nonzero(window)
    keep = torch.ones_like(mask)
    if len(candidates) > 0:
        count = max(int(config.clip_cov_ratio * int(valid.sum().item())), 1)
        order = torch.randperm(len(candidates))[:count].to(candidates.device)
        chosen = candidates[order]
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
    pg_losses = torch.maximum(loss_unclipped, loss_clipped) * keep
    weights = _off_policy_weights(old_log_prob, rollout_log_probs, response_mask, config)
    # verl's pg_clipfrac here is the detached share; PPO's clip share is pg_clipfrac_ppo
    extra = {"actor/pg_clipfrac": keep == 0, "actor/pg_clipfrac_ppo": clipped}
    extra["actor/clip_cov_frac"] = keep == 0
    return _finish(pg_losses, mask, log_ratio, config, scale, weights, extra)


def compute_kl_cov_policy_loss(
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    scale: LossScale,
    rollout_log_probs: torch.Tensor | None = None,
) -> Result:
    """KL-Cov (arXiv:2505.22617): ``-A r``, plus ``ppo_kl_coef * |log pi - log pi_old|`` on
    the top ``max(1, floor(kl_cov_ratio * valid))`` tokens by covariance (no random draw)."""
    mask = response_mask.to(log_prob.dtype)
    valid = response_mask.bool()
    log_ratio = _log_ratio(log_prob, old_log_prob)
    pg_losses = -advantages * log_ratio.exp()
    penalised = torch.zeros_like(valid)
    num_valid = int(valid.sum().item())
    if num_valid > 0:
        cov = _covariance(advantages, log_prob, valid)[valid]
        k = max(1, int(num_valid * config.kl_cov_ratio))
        flat = torch.nonzero(valid.flatten()).flatten()[torch.topk(cov, k).indices]
        penalised.view(-1)[flat] = True
    abs_kl = (log_prob - old_log_prob).abs()
    pg_losses = torch.where(penalised, pg_losses + config.ppo_kl_coef * abs_kl, pg_losses)
    weights = _off_policy_weights(old_log_prob, rollout_log_probs, response_mask, config)
    # verl's ppo_kl of kl_cov is the mean |log pi - log pi_old| (the penalty's term);
    # the signed mean that every other loss reports as ppo_kl is `ppo_kl_signed`
    extra = {
        "actor/kl_cov_frac": penalised,
        "actor/ppo_kl": abs_kl,
        "actor/ppo_kl_signed": -log_ratio,
    }
    return _finish(pg_losses, mask, log_ratio, config, scale, weights, extra)


def compute_reinforce_policy_loss(
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    scale: LossScale,
    rollout_log_probs: torch.Tensor | None = None,
) -> Result:
    """REINFORCE (Williams 1992): ``-A log pi`` per token (verl's `reinforce`).
    ``actor/ppo_kl`` is the mean of ``log pi_rollout - log pi`` (``old_log_prob`` without
    rollout log-probs, as verl's bypass mode)."""
    mask = response_mask.to(log_prob.dtype)
    weights = _off_policy_weights(old_log_prob, rollout_log_probs, response_mask, config)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    behaviour = old_log_prob if rollout_log_probs is None else rollout_log_probs
    extra = {"actor/ppo_kl": behaviour - log_prob.detach()}
    return _finish(-advantages * log_prob, mask, log_ratio, config, scale, weights, extra)


def compute_gpg_policy_loss(
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    scale: LossScale,
    rollout_log_probs: torch.Tensor | None = None,
) -> Result:
    """GPG (arXiv:2504.02546): the plain policy gradient ``-A log pi`` (no ratio or clip),
    for the `gpg` estimator; ``actor/ppo_kl`` as for the clipped losses."""
    mask = response_mask.to(log_prob.dtype)
    weights = _off_policy_weights(old_log_prob, rollout_log_probs, response_mask, config)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    return _finish(-advantages * log_prob, mask, log_ratio, config, scale, weights)


def compute_geo_mean_policy_loss(
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    scale: LossScale,
    rollout_log_probs: torch.Tensor | None = None,
) -> Result:
    """GMPO (arXiv:2507.20673): ``d' = sgn(A) min(sgn(A) d, sgn(A) clip(d, -eps_low, eps_high))``
    per token, loss ``-mean_t(A) * exp(mean_t d')`` per sequence, averaged over sequences
    (`agg_mode` ignored); IS weights enter as their per-sequence geometric mean."""
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    clipped_log_ratio = log_ratio.clamp(-config.clip_ratio_low, config.clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped_log_ratio)
    lengths = mask.sum(dim=-1).clamp(min=1)
    seq_ratio = torch.exp((pessimistic * mask).sum(dim=-1) / lengths)
    seq_adv = (advantages * mask).sum(dim=-1) / lengths
    seq_losses = -seq_adv * seq_ratio
    weights = _off_policy_weights(old_log_prob, rollout_log_probs, response_mask, config)
    if weights is not None:
        seq_weights = torch.exp((torch.log(weights + 1e-10) * mask).sum(dim=-1) / lengths)
        seq_losses = seq_losses * seq_weights
    loss = seq_losses.sum() / max(scale.global_num_seqs, 1)
    clipped = log_ratio != clipped_log_ratio
    metrics = {
        "actor/pg_loss": float(loss.detach().item()),
        "actor/ppo_kl": _partial(-log_ratio, mask, scale),
        "actor/pg_clipfrac": _partial((clipped & (advantages > 0)).float(), mask, scale),
        "actor/pg_clipfrac_lower": _partial((clipped & (advantages < 0)).float(), mask, scale),
    }
    return loss, metrics


def compute_cispo_policy_loss(
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    scale: LossScale,
    rollout_log_probs: torch.Tensor | None = None,
) -> Result:
    """CISPO (arXiv:2506.13585): ``-sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi``;
    every token keeps its gradient (the `cispo` preset: eps_low >= 1, no lower bound)."""
    mask = response_mask.to(log_prob.dtype)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    clipped_ratio = ratio.clamp(1 - config.clip_ratio_low, 1 + config.clip_ratio_high)
    pg_losses = -clipped_ratio.detach() * advantages * log_prob
    weights = _off_policy_weights(old_log_prob, rollout_log_probs, response_mask, config)
    clipfrac = {"actor/pg_clipfrac": ratio != clipped_ratio}
    no_dual_clip = {"actor/pg_clipfrac_lower": 0.0}  # verl reports 0
    return _finish(pg_losses, mask, log_ratio, config, scale, weights, clipfrac, no_dual_clip)


def compute_sapo_policy_loss(
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    scale: LossScale,
    rollout_log_probs: torch.Tensor | None = None,
) -> Result:
    """SAPO (arXiv:2511.20347): ``-f(r) * A``, ``f(r) = (4 / tau) sigmoid(tau (r - 1))``,
    ``tau = tau_pos`` where A > 0 else ``tau_neg`` (f'(1) = 1: PPO's gradient near r = 1)."""
    mask = response_mask.to(log_prob.dtype)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    tau = torch.where(
        advantages > 0,
        torch.as_tensor(config.tau_pos, dtype=ratio.dtype, device=ratio.device),
        torch.as_tensor(config.tau_neg, dtype=ratio.dtype, device=ratio.device),
    )
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    weights = _off_policy_weights(old_log_prob, rollout_log_probs, response_mask, config)
    # verl reports both clip fractions as 0: the gate is soft, nothing is clipped
    no_clip = {"actor/pg_clipfrac": 0.0, "actor/pg_clipfrac_lower": 0.0}
    return _finish(-gate * advantages, mask, log_ratio, config, scale, weights, None, no_clip)


def _dppo(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    scale: LossScale,
    rollout_log_probs: torch.Tensor | None,
    inside: torch.Tensor,
) -> Result:
    """The DPPO loss given the trust-region mask `inside` (per token, no gradient)."""
    mask = response_mask.to(log_prob.dtype)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    truncated = ratio.clamp(max=config.clip_ratio_c).detach()
    inside = inside.detach()
    pg_losses = -advantages * truncated * log_prob * inside.to(log_prob.dtype)
    weights = _off_policy_weights(old_log_prob, rollout_log_probs, response_mask, config)
    extra = {"actor/pg_clipfrac": ~inside}
    extra["actor/pg_clipfrac_lower"] = (ratio > config.clip_ratio_c) & inside
    return _finish(pg_losses, mask, log_ratio, config, scale, weights, extra)


def compute_dppo_tv_policy_loss(
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    scale: LossScale,
    rollout_log_probs: torch.Tensor | None = None,
) -> Result:
    """DPPO Binary-TV (arXiv:2602.04879): ``-A * sg(min(r, clip_ratio_c)) * log pi * M``; M
    drops tokens with ``pi - pi_old > eps_high`` (A > 0) or ``< -eps_low`` (A <= 0)."""
    diff = log_prob.exp() - old_log_prob.exp()
    inside = torch.where(
        advantages > 0, diff <= config.clip_ratio_high, diff >= -config.clip_ratio_low
    )
    return _dppo(
        log_prob, old_log_prob, advantages, response_mask, config, scale, rollout_log_probs, inside
    )


def compute_dppo_kl_policy_loss(
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    scale: LossScale,
    rollout_log_probs: torch.Tensor | None = None,
) -> Result:
    """DPPO Binary-KL: `dppo_tv` with the sampled token's Bernoulli KL
    ``D = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p))``; a token is
    dropped when D > eps_high and p > p_old (A > 0), or D > eps_low and p < p_old (A <= 0)."""
    p = log_prob.exp()
    p_old = old_log_prob.exp()
    divergence = p_old * (old_log_prob - log_prob) + (1 - p_old) * torch.log(
        (1 - p_old + 1e-8) / (1 - p + 1e-8)
    )
    inside_pos = (divergence <= config.clip_ratio_high) | (p <= p_old)
    inside_neg = (divergence <= config.clip_ratio_low) | (p >= p_old)
    inside = torch.where(advantages > 0, inside_pos, inside_neg)
    return _dppo(
        log_prob, old_log_prob, advantages, response_mask, config, scale, rollout_log_probs, inside
    )


def compute_dro_policy_loss(
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    scale: LossScale,
    rollout_log_probs: torch.Tensor | None = None,
) -> Result:
    """DRO (arXiv:2405.19107): ``-(A log pi - 0.5 * dro_beta * (log pi - log pi_old)^2)``."""
    mask = response_mask.to(log_prob.dtype)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    penalty = 0.5 * config.dro_beta * (log_prob - old_log_prob).square()
    pg_losses = -(advantages * log_prob - penalty)
    weights = _off_policy_weights(old_log_prob, rollout_log_probs, response_mask, config)
    return _finish(pg_losses, mask, log_ratio, config, scale, weights)

"""Rollout correction: the off-policy gap between the policy that sampled the tokens and
the trainer's, as verl 0.9 defines it (`verl.trainer.ppo.rollout_corr_helper`); the
settings are explained in the package README.

Per token ``log r = log pi_old - log pi_rollout``. Sequence weights are ``exp(sum log r)``
(clamped at +-20 in log space); ``"L_U"`` with L = 0 (verl needs L > 0) is AReaL's
decoupled PPO. Rejection divergences per token: ``k1 = -log r``, ``k2 = (log r)^2 / 2``,
``k3 = r - 1 - log r``; k1 thresholds bound ``exp(k1) = pi_rollout / pi_old``. Rejection
runs in the driver before the advantages (`apply_rejection`); the weights per micro-batch
in the loss (`importance_weights`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from rl_core.config import check

__all__ = [
    "RS_OPTIONS",
    "RolloutCorrectionConfig",
    "apply_rejection",
    "correction_metrics",
    "importance_weights",
    "partial_is_metrics",
]

SAFETY_BOUND = 20.0  # |log r| is clamped here before exp (exp(20) ~ 4.9e8)
RS_OPTIONS: tuple[str, ...] = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)  # fmt: skip
PREFIX = "rollout_corr/"


def _bounds(spec: float | str, field: str, allow_zero_lower: bool) -> tuple[float | None, float]:
    """(lower or None, upper) of a threshold: a number U, or a string "U" or "L_U"."""
    if isinstance(spec, str):
        parts = spec.strip().split("_")
        try:
            values = [float(p) for p in parts]
        except ValueError:
            values = []
        check(len(values) in (1, 2) and all(math.isfinite(v) for v in values), field, spec,
              "a number U or a string 'L_U' (e.g. '0.5_2.0')")  # fmt: skip
        lower, upper = (None, values[0]) if len(values) == 1 else (values[0], values[1])
    else:
        lower, upper = None, float(spec)
    check(upper > 0, field, spec, "an upper bound > 0")
    if lower is not None:
        least = "0" if allow_zero_lower else "> 0"
        ok = (lower >= 0 if allow_zero_lower else lower > 0) and lower <= upper
        check(ok, field, spec, f"'L_U' with L >= {least} and L <= U")
    return lower, upper


@dataclass
class RolloutCorrectionConfig:
    """Rollout correction (the `actor.loss.rollout_correction` section; verl's
    `algorithm.rollout_correction`, same field names). See `rl_algos.rollout_correction`.

    rollout_is: importance weights per `token` or per `sequence` (null: none).
    rollout_is_threshold: a number U (truncate at U, TIS) or "L_U" (zero outside [L, U],
        IcePop; L = 0 is AReaL's decoupled PPO: drop tokens above U).
    rollout_rs: rejection, comma-separated options of RS_OPTIONS (null: none).
    rollout_rs_threshold: one threshold per option, comma-separated, or one for all:
        "L_U" ratio bounds for k1 options (a single U means 1/U..U), an upper bound else.
    rollout_token_veto_threshold: reject a sequence with a token whose ratio
        pi_old / pi_rollout is below this (null: off).
    """

    rollout_is: Literal["token", "sequence"] | None = None
    rollout_is_threshold: float | str = 2.0
    rollout_rs: str | None = None
    rollout_rs_threshold: float | str | None = None
    rollout_token_veto_threshold: float | None = None

    def __post_init__(self) -> None:
        self.is_bounds = _bounds(self.rollout_is_threshold, "rollout_is_threshold", True)
        self.rs_bounds = self._rs_bounds()
        token_rs = [o for o in self.rs_bounds if o.startswith("token")]
        check(not (token_rs and self.rollout_is == "sequence"), "rollout_rs", self.rollout_rs,
              "sequence-level options (seq_*) with rollout_is=sequence: the sequence weight "
              f"multiplies all its tokens' ratios, those {token_rs} rejects too")  # fmt: skip
        veto = self.rollout_token_veto_threshold
        check(veto is None or 0 < veto < 1, "rollout_token_veto_threshold", veto,
              "a ratio in (0, 1) or null")  # fmt: skip

    def _rs_bounds(self) -> dict[str, tuple[float | None, float]]:
        if self.rollout_rs is None:
            check(self.rollout_rs_threshold is None, "rollout_rs_threshold",
                  self.rollout_rs_threshold, "null when rollout_rs is null")  # fmt: skip
            return {}
        options = list(dict.fromkeys(o.strip() for o in self.rollout_rs.split(",") if o.strip()))
        for option in options or [self.rollout_rs]:
            check(option in RS_OPTIONS, "rollout_rs", self.rollout_rs,
                  f"comma-separated options of {list(RS_OPTIONS)}", RS_OPTIONS)  # fmt: skip
        spec = self.rollout_rs_threshold
        check(spec is not None, "rollout_rs_threshold", spec, "a threshold when rollout_rs is set")
        parts = [p.strip() for p in str(spec).split(",") if p.strip()]
        check(len(parts) in (1, len(options)), "rollout_rs_threshold", spec,
              f"one threshold, or {len(options)} (one per rollout_rs option)")  # fmt: skip
        parts = parts * len(options) if len(parts) == 1 else parts
        bounds = {}
        for option, part in zip(options, parts, strict=True):
            lower, upper = _bounds(part, "rollout_rs_threshold", False)
            if option.endswith("k1"):
                check(lower is not None or upper >= 1, "rollout_rs_threshold", spec,
                      f"a ratio bound U >= 1 for {option} (it means 1/U..U), or 'L_U'")  # fmt: skip
                bounds[option] = (1.0 / upper if lower is None else lower, upper)
            else:
                check(lower is None, "rollout_rs_threshold", spec,
                      f"a single upper bound for {option} (no 'L_U')")  # fmt: skip
                bounds[option] = (None, upper)
        return bounds

    @property
    def rejects(self) -> bool:
        """Whether tokens or sequences are rejected (needs the old log-probs in the driver)."""
        return bool(self.rs_bounds) or self.rollout_token_veto_threshold is not None

    @property
    def enabled(self) -> bool:
        return self.rollout_is is not None or self.rejects

    @classmethod
    def tis(cls, cap: float) -> RolloutCorrectionConfig:
        """Truncated importance sampling per token, min(r, cap)."""
        return cls(rollout_is="token", rollout_is_threshold=float(cap))

    @classmethod
    def decoupled_ppo(cls, cap: float) -> RolloutCorrectionConfig:
        """AReaL's decoupled PPO: the behaviour weight r per token, 0 above the cap."""
        return cls(rollout_is="token", rollout_is_threshold=f"0_{float(cap)}")


# ----------------------------------------------------------------------------- helpers


def _masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    kept = torch.where(mask.bool(), values, torch.zeros_like(values))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return _masked_sum(values, mask, dim) / (count + 1e-8)  # verl's epsilon, for parity


def _log_ratio(old_log_prob: torch.Tensor, rollout_log_probs: torch.Tensor) -> torch.Tensor:
    return (old_log_prob - rollout_log_probs).detach()


def _raw_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """r per token, or prod_t r_t per sequence broadcast to its tokens; 0 on padding."""
    if level == "token":
        raw = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    else:
        total = _masked_sum(log_ratio, mask, dim=-1).unsqueeze(-1)
        raw = total.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp().expand_as(log_ratio)
    return raw * mask


def _applied(raw: torch.Tensor, bounds: tuple[float | None, float]) -> torch.Tensor:
    lower, upper = bounds
    if lower is None:
        return raw.clamp(max=upper)
    inside = (raw >= lower) & (raw <= upper)
    return torch.where(inside, raw, torch.zeros_like(raw))


def importance_weights(
    old_log_prob: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    config: RolloutCorrectionConfig,
) -> torch.Tensor | None:
    """The per-token weights (no gradient, 0 on padding) of `config.rollout_is`, or None."""
    if config.rollout_is is None:
        return None
    mask = response_mask.to(old_log_prob.dtype)
    raw = _raw_weights(_log_ratio(old_log_prob, rollout_log_probs), mask, config.rollout_is)
    return _applied(raw, config.is_bounds)


def partial_is_metrics(
    old_log_prob: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    config: RolloutCorrectionConfig,
    num_tokens: int,
    num_seqs: int,
) -> dict[str, float]:
    """verl's summable IS metrics (``rollout_is_mean``, threshold fractions, ``kl``,
    ``k3_kl``, ``chi2_token``) as this micro-batch's partials of the mini-batch's
    `num_tokens` / `num_seqs`; for one-step updates, where the driver cannot report them."""
    if config.rollout_is is None:
        return {}
    mask = response_mask.to(old_log_prob.dtype)
    log_ratio = _log_ratio(old_log_prob, rollout_log_probs)
    raw = _raw_weights(log_ratio, mask, config.rollout_is)
    weights = _applied(raw, config.is_bounds)
    lower, upper = config.is_bounds
    low = 1.0 / upper if lower is None else lower
    tokens = max(num_tokens, 1)
    out = {"rollout_is_mean": float(_masked_sum(weights, mask)) / tokens}
    if config.rollout_is == "token":
        out["rollout_is_ratio_fraction_high"] = float(_masked_sum((raw > upper).float(), mask))
        out["rollout_is_ratio_fraction_high"] /= tokens
        out["rollout_is_ratio_fraction_low"] = float(_masked_sum((raw < low).float(), mask))
        out["rollout_is_ratio_fraction_low"] /= tokens
    else:  # per sequence, in log space (the clamp at +-20 does not hide an outlier)
        total = _masked_sum(log_ratio, mask, dim=-1)
        seqs = max(num_seqs, 1)
        out["rollout_is_ratio_fraction_high"] = float((total > math.log(upper)).sum()) / seqs
        low_log = math.log(low) if low > 0 else -math.inf
        out["rollout_is_ratio_fraction_low"] = float((total < low_log).sum()) / seqs
    if lower is not None:
        oob = (raw < lower) | (raw > upper)
        out["rollout_is_oob_ratio"] = float(_masked_sum(oob.float(), mask)) / tokens
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    out["kl"] = float(_masked_sum(-log_ratio, mask)) / tokens
    out["k3_kl"] = float(_masked_sum(log_ratio.exp() - log_ratio - 1, mask)) / tokens
    out["chi2_token"] = float(_masked_sum(safe.exp().square() - 1.0, mask)) / tokens
    return {PREFIX + k: v for k, v in out.items()}


# ----------------------------------------------------------------------------- driver


def _divergences(log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {"k1": -safe, "k2": 0.5 * safe.square(), "k3": safe.exp() - 1.0 - safe}


def _seq_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    masked = values.masked_fill(~mask.bool(), -math.inf).max(dim=-1).values
    return torch.where(torch.isinf(masked), torch.zeros_like(masked), masked)


def _std(values: torch.Tensor, mask: torch.Tensor) -> float:
    if mask.sum() <= 1:
        return 0.0
    mean = _masked_mean(values, mask)
    return float((_masked_mean(values.square(), mask) - mean.square()).clamp(min=0).sqrt())


def _seq_summary(prefix: str, seq: torch.Tensor, ideal: float) -> dict[str, float]:
    if seq.numel() == 0:
        return {f"{prefix}_seq_{k}": 0.0 for k in ("mean", "std", "max", "min", "max_deviation")}
    return {
        f"{prefix}_seq_mean": float(seq.mean()),
        f"{prefix}_seq_std": float(seq.std()) if seq.numel() > 1 else 0.0,
        f"{prefix}_seq_max": float(seq.max()),
        f"{prefix}_seq_min": float(seq.min()),
        f"{prefix}_seq_max_deviation": float((seq - ideal).abs().max()),
    }


def _is_metrics(log_ratio: torch.Tensor, mask: torch.Tensor, config: RolloutCorrectionConfig):
    level = config.rollout_is
    lower, upper = config.is_bounds
    low = 1.0 / upper if lower is None else lower
    raw = _raw_weights(log_ratio, mask, level)
    weights = _applied(raw, config.is_bounds)
    valid = mask.bool()
    m: dict[str, float] = {"rollout_is_mean": float(_masked_mean(weights, mask))}
    if level == "sequence":
        total = _masked_sum(log_ratio, mask, dim=-1)
        m["rollout_is_max"] = math.exp(min(float(total.max()), SAFETY_BOUND))
        m["rollout_is_min"] = math.exp(float(total.min()))
        m["rollout_is_ratio_fraction_high"] = float((total > math.log(upper)).float().mean())
        low_log = math.log(low) if low > 0 else -math.inf
        m["rollout_is_ratio_fraction_low"] = float((total < low_log).float().mean())
    else:
        m["rollout_is_ratio_fraction_high"] = float(_masked_mean((raw > upper).float(), mask))
        m["rollout_is_ratio_fraction_low"] = float(_masked_mean((raw < low).float(), mask))
        m["rollout_is_max"] = float(weights[valid].max())
        m["rollout_is_min"] = float(weights[valid].min())
    capped = weights.clamp(0.0, upper)
    m["rollout_is_std"] = _std(capped, mask)
    normalised = capped / (_masked_mean(capped, mask) + 1e-8)
    m["rollout_is_eff_sample_size"] = 1.0 / float(_masked_mean(normalised.square(), mask))
    seq_weights = _masked_mean(weights, mask, dim=-1)
    m.update(_seq_summary("rollout_is", seq_weights, 1.0))
    raw_seq = _masked_mean(raw, mask, dim=-1)
    m["rollout_is_seq_fraction_high"] = float((raw_seq > upper).float().mean())
    m["rollout_is_seq_fraction_low"] = float((raw_seq < low).float().mean())
    if lower is not None:
        oob = (raw < lower) | (raw > upper)
        m["rollout_is_oob_ratio"] = float(_masked_mean(oob.float(), mask))
    return m


def _rejection(log_ratio: torch.Tensor, mask: torch.Tensor, config: RolloutCorrectionConfig):
    """(keep per token, metrics) of `rollout_rs`: every option must pass."""
    div = _divergences(log_ratio)
    valid = mask.bool()
    seq_valid = valid.any(dim=-1)
    keep = torch.ones_like(valid)
    m: dict[str, float] = {}
    for option, (lower, upper) in config.rs_bounds.items():
        kind = option[-2:]
        k1 = kind == "k1"
        hi = math.log(upper) if k1 else upper
        lo = math.log(lower) if k1 else 0.0  # type: ignore[arg-type]
        token_stat = div[kind]
        if option.startswith("token"):
            stat, per_seq = token_stat, None
        else:
            reduce = {"seq_sum": _masked_sum, "seq_mean": _masked_mean}.get(option[:-3])
            per_seq = reduce(token_stat, mask, -1) if reduce else _seq_max(token_stat, mask)
            stat = per_seq.unsqueeze(-1).expand_as(token_stat)
        ok = (stat <= hi) & ((stat >= lo) if k1 else torch.ones_like(valid))
        keep &= ok
        p = f"rollout_rs_{option}"
        seq = (per_seq if per_seq is not None else _masked_mean(stat, mask, dim=-1))[seq_valid]
        m[f"{p}_mean"] = float(_masked_mean(stat, mask))
        if per_seq is not None and seq.numel() > 0:
            m[f"{p}_max"], m[f"{p}_min"] = float(seq.max()), float(seq.min())
            m[f"{p}_fraction_high"] = float((seq > hi).float().mean())
            m[f"{p}_fraction_low"] = float((seq < lo).float().mean()) if k1 else 0.0
        else:
            m[f"{p}_max"] = float(stat.masked_fill(~valid, -math.inf).max())
            m[f"{p}_min"] = float(stat.masked_fill(~valid, math.inf).min())
            m[f"{p}_fraction_high"] = float(_masked_mean((stat > hi).float(), mask))
            low_share = _masked_mean((stat < lo).float(), mask)
            m[f"{p}_fraction_low"] = float(low_share) if k1 else 0.0
        m[f"{p}_std"] = _std(stat.clamp(min=lo if k1 else 0.0, max=hi), mask)
        m.update(_seq_summary(p, seq, 0.0))
        if seq.numel() > 0:
            m[f"{p}_seq_fraction_high"] = float((seq > hi).float().mean())
            if k1:
                m[f"{p}_seq_fraction_low"] = float((seq < lo).float().mean())
        else:
            m[f"{p}_seq_fraction_high"] = 0.0
            m[f"{p}_seq_fraction_low"] = 0.0
        m[f"{p}_masked_fraction"] = float(_masked_mean((~ok).float(), mask))
        rejected_seq = ((~ok) & valid).any(dim=-1)
        m[f"{p}_seq_masked_fraction"] = (
            float(rejected_seq[seq_valid].float().mean()) if seq_valid.any() else 0.0
        )
    return keep, m


def _offpolicy_metrics(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor):
    train_lp = _masked_mean(old, mask, dim=-1)
    roll_lp = _masked_mean(rollout, mask, dim=-1)
    log_ratio = old - rollout
    diff = roll_lp - train_lp
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    seq_sum = _masked_sum(log_ratio, mask, dim=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training_ppl": float(torch.exp(-train_lp).mean()),
        "training_log_ppl": float((-train_lp).mean()),
        "kl": float(_masked_mean(rollout - old, mask)),
        "k3_kl": float(_masked_mean(log_ratio.exp() - log_ratio - 1, mask)),
        "rollout_ppl": float(torch.exp(-roll_lp).mean()),
        "rollout_log_ppl": float((-roll_lp).mean()),
        "log_ppl_diff": float(diff.mean()),
        "log_ppl_abs_diff": float(diff.abs().mean()),
        "log_ppl_diff_max": float(diff.max()),
        "log_ppl_diff_min": float(diff.min()),
        "ppl_ratio": float(diff.exp().mean()),
        "chi2_token": float(_masked_mean(safe.exp().square(), mask)) - 1.0,
        "chi2_seq": float((2.0 * seq_sum).exp().mean()) - 1.0,
    }


def correction_metrics(
    old_log_prob: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    config: RolloutCorrectionConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(response mask after rejection and veto, verl's ``rollout_corr/*`` metrics), float64."""
    if old_log_prob.shape != rollout_log_probs.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            "old_log_probs, rollout_log_probs and response_mask differ in shape: "
            f"{tuple(old_log_prob.shape)}, {tuple(rollout_log_probs.shape)}, "
            f"{tuple(response_mask.shape)}"
        )
    old = old_log_prob.detach().double()
    rollout = rollout_log_probs.detach().double()
    mask = response_mask.detach().double()
    if not mask.bool().any():
        return response_mask, {}
    log_ratio = old - rollout
    metrics: dict[str, float] = {}
    if config.rollout_is is not None:
        metrics.update(_is_metrics(log_ratio, mask, config))
    keep = torch.ones_like(mask, dtype=torch.bool)
    if config.rs_bounds:
        keep, rs_metrics = _rejection(log_ratio, mask, config)
        metrics.update(rs_metrics)
        metrics["rollout_rs_masked_fraction"] = float(_masked_mean((~keep).float(), mask))
        rejected = ((~keep) & mask.bool()).any(dim=-1)
        metrics["rollout_rs_seq_masked_fraction"] = float(rejected.float().mean())
    veto = config.rollout_token_veto_threshold
    if veto is not None:
        below = (log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp() < veto) & mask.bool()
        vetoed = below.any(dim=-1)
        seq_valid = mask.bool().any(dim=-1)
        metrics["rollout_is_veto_fraction"] = float(vetoed[seq_valid].float().mean())
        metrics["rollout_is_catastrophic_token_fraction"] = float(_masked_mean(below.float(), mask))
        keep &= ~vetoed.unsqueeze(-1)
    metrics.update(_offpolicy_metrics(old, rollout, mask))
    new_mask = (response_mask * keep.to(response_mask.dtype)).to(response_mask.dtype)
    return new_mask, {PREFIX + k: v for k, v in metrics.items()}


def apply_rejection(batch: dict[str, torch.Tensor], config: RolloutCorrectionConfig):
    """Replace ``response_mask`` in `batch` (TensorDict or dict of [b, R] tensors, with
    ``old_log_probs`` and ``rollout_log_probs``) by its rejected version; return metrics."""
    for key in ("old_log_probs", "rollout_log_probs"):
        if key not in set(batch.keys()):
            raise KeyError(f"rollout correction needs {key!r} in the batch (it has none)")
    new_mask, metrics = correction_metrics(
        batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"], config
    )
    batch["response_mask"] = new_mask
    return metrics

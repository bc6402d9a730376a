"""Algorithm presets (``algorithm.preset``): named sets of config fields, applied after the
defaults and before the YAML and overrides, so a preset never hides what a user writes."""

from __future__ import annotations

from typing import Any

__all__ = ["PRESETS"]


def _preset(
    estimator: str, n: int, loss: str, algorithm: dict[str, Any] | None = None, **options: Any
) -> dict[str, Any]:
    """Advantage estimator `estimator` (more `algorithm` fields), `n` samples per prompt and
    policy loss `loss` with `options`; no KL loss term unless `options` sets ``kl_loss_coef``."""
    return {
        "algorithm": {"adv_estimator": estimator, **(algorithm or {})},
        "rollout": {"n": n},
        "actor": {"loss": {"name": loss, "kl_loss_coef": 0.0, **options}},
    }


_PPO = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "agg_mode": "token-mean"}

PRESETS: dict[str, dict[str, Any]] = {
    # PPO (Schulman et al. 2017; Ouyang et al. 2022): a critic and GAE, one sample per prompt.
    "ppo": {
        "algorithm": {"adv_estimator": "gae", "gamma": 1.0, "lam": 1.0},
        "rollout": {"n": 1},
        "actor": {"loss": {"name": "ppo", **_PPO}},
    },
    # GRPO (Shao et al. 2024): group-normalised outcome advantages and a k3 KL loss term.
    "grpo": _preset(
        "grpo",
        4,
        "ppo",
        {"norm_adv_by_std_in_grpo": True},
        agg_mode="token-mean",
        kl_loss_coef=0.001,
        kl_loss_type="k3",
    ),
    # Dr.GRPO (Liu et al. 2025): no std normalisation, no length normalisation.
    "dr_grpo": _preset("dr_grpo", 4, "ppo", agg_mode="seq-mean-token-sum-norm"),
    # DAPO (Yu et al. 2025): clip-higher, token-mean, no KL, dynamic sampling, overlong shaping.
    "dapo": _preset(
        "grpo",
        4,
        "ppo",
        {
            "dynamic_sampling": {"enabled": True, "metric": "seq_score"},
            "overlong": {"enabled": True, "penalty_factor": 1.0},
        },
        **{**_PPO, "clip_ratio_high": 0.28},
    ),
    # GSPO (Zheng et al. 2025): sequence-level ratio, tiny clip range, per-sequence means.
    "gspo": _preset(
        "grpo", 4, "gspo", clip_ratio_low=3e-4, clip_ratio_high=4e-4, agg_mode="seq-mean-token-mean"
    ),
    # RLOO (Ahmadian et al. 2024): leave-one-out baseline.
    "rloo": _preset("rloo", 4, "ppo"),
    # REINFORCE++ (Hu 2025): batch-whitened returns, token-level KL in the reward.
    "reinforce_pp": _preset(
        "reinforce_plus_plus",
        1,
        "ppo",
        {
            "use_kl_in_reward": True,
            "kl_penalty": "k1",
            "kl_ctrl": {"type": "fixed", "kl_coef": 0.001},
        },
    ),
    # CISPO (MiniMax-M1, 2025): clipped, stop-gradient IS weights; no lower bound, as
    # verl's example (clip_ratio_low=10, clip_ratio_high=0.2).
    "cispo": _preset("grpo", 4, "cispo", **{**_PPO, "clip_ratio_low": 10.0}),
    # GPG (Chu et al. 2025): the GPG estimator and the plain policy gradient, no KL.
    "gpg": _preset("gpg", 4, "gpg", agg_mode="token-mean"),
    # GMPO (Zhao et al. 2025): geometric-mean ratio, log-ratio clipped to [-0.4, 0.4].
    "gmpo": _preset("grpo", 4, "geo_mean", clip_ratio_low=0.4, clip_ratio_high=0.4),
    # SAPO (Gao et al. 2025): soft gate with the paper's temperatures, per-sequence means.
    "sapo": _preset("grpo", 4, "sapo", tau_pos=1.0, tau_neg=1.05, agg_mode="seq-mean-token-mean"),
    # Clip-Cov (Cui et al. 2025): DAPO's recipe with covariance-based gradient detaching.
    "clip_cov": _preset(
        "grpo", 4, "clip_cov", **_PPO, clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0
    ),
    # KL-Cov (Cui et al. 2025): a KL penalty on the top-covariance tokens.
    "kl_cov": _preset(
        "grpo", 4, "kl_cov", kl_cov_ratio=0.0002, ppo_kl_coef=1.0, agg_mode="token-mean"
    ),
    # DPPO (arXiv:2602.04879), Binary-TV trust region; a large TIS truncation (Sec. 5.4).
    "dppo": _preset("grpo", 4, "dppo_tv", **_PPO, clip_ratio_c=20.0),
    # OPO (Hao et al. 2025): length-weighted baseline, no KL (the paper also trains exactly
    # on-policy: one mini-batch per step, actor.mini_batch_size = data.train_batch_size).
    "opo": _preset("opo", 4, "ppo", agg_mode="token-mean"),
    # ReMax (Li et al. 2023): the greedy response's reward as the baseline, one sample.
    "remax": _preset("remax", 1, "ppo"),
}

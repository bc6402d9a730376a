"""Algorithm presets: named sets of config fields, nothing more.

Chosen with ``algorithm.preset: <name>`` in the YAML or ``algorithm.preset=<name>`` on
the command line. Precedence: dataclass defaults < preset < YAML file < command-line
overrides, so a preset never hides what a user writes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PRESETS"]

PRESETS: dict[str, dict[str, Any]] = {
    # PPO (Schulman et al. 2017; Ouyang et al. 2022): a critic and GAE, one sample per prompt.
    "ppo": {
        "algorithm": {"adv_estimator": "gae", "gamma": 1.0, "lam": 1.0},
        "rollout": {"n": 1},
        "actor": {
            "loss": {
                "name": "ppo",
                "clip_ratio_low": 0.2,
                "clip_ratio_high": 0.2,
                "agg_mode": "token-mean",
            }
        },
    },
    # GRPO (Shao et al. 2024): group-normalised outcome advantages and a k3 KL loss term.
    "grpo": {
        "algorithm": {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True},
        "rollout": {"n": 4},
        "actor": {
            "loss": {
                "name": "ppo",
                "agg_mode": "token-mean",
                "kl_loss_coef": 0.001,
                "kl_loss_type": "k3",
            }
        },
    },
    # Dr.GRPO (Liu et al. 2025): no std normalisation, no length normalisation.
    "dr_grpo": {
        "algorithm": {"adv_estimator": "dr_grpo"},
        "rollout": {"n": 4},
        "actor": {
            "loss": {"name": "ppo", "agg_mode": "seq-mean-token-sum-norm", "kl_loss_coef": 0.0}
        },
    },
    # DAPO (Yu et al. 2025): clip-higher, token-mean, no KL, dynamic sampling, overlong shaping.
    "dapo": {
        "algorithm": {
            "adv_estimator": "grpo",
            "dynamic_sampling": {"enabled": True, "metric": "seq_score"},
            "overlong": {"enabled": True, "penalty_factor": 1.0},
        },
        "rollout": {"n": 4},
        "actor": {
            "loss": {
                "name": "ppo",
                "clip_ratio_low": 0.2,
                "clip_ratio_high": 0.28,
                "agg_mode": "token-mean",
                "kl_loss_coef": 0.0,
            }
        },
    },
    # GSPO (Zheng et al. 2025): sequence-level ratio, tiny clip range, per-sequence means.
    "gspo": {
        "algorithm": {"adv_estimator": "grpo"},
        "rollout": {"n": 4},
        "actor": {
            "loss": {
                "name": "gspo",
                "clip_ratio_low": 3e-4,
                "clip_ratio_high": 4e-4,
                "agg_mode": "seq-mean-token-mean",
                "kl_loss_coef": 0.0,
            }
        },
    },
    # RLOO (Ahmadian et al. 2024): leave-one-out baseline.
    "rloo": {
        "algorithm": {"adv_estimator": "rloo"},
        "rollout": {"n": 4},
        "actor": {"loss": {"name": "ppo", "kl_loss_coef": 0.0}},
    },
    # REINFORCE++ (Hu 2025): batch-whitened returns, token-level KL in the reward.
    "reinforce_pp": {
        "algorithm": {
            "adv_estimator": "reinforce_plus_plus",
            "use_kl_in_reward": True,
            "kl_penalty": "k1",
            "kl_ctrl": {"type": "fixed", "kl_coef": 0.001},
        },
        "rollout": {"n": 1},
        "actor": {"loss": {"name": "ppo", "kl_loss_coef": 0.0}},
    },
    # CISPO (MiniMax-M1, 2025): clipped, stop-gradient IS weights; no lower bound, as
    # verl's example (clip_ratio_low=10, clip_ratio_high=0.2).
    "cispo": {
        "algorithm": {"adv_estimator": "grpo"},
        "rollout": {"n": 4},
        "actor": {
            "loss": {
                "name": "cispo",
                "clip_ratio_low": 10.0,
                "clip_ratio_high": 0.2,
                "agg_mode": "token-mean",
                "kl_loss_coef": 0.0,
            }
        },
    },
    # GPG (Chu et al. 2025): the GPG estimator and the plain policy gradient, no KL.
    "gpg": {
        "algorithm": {"adv_estimator": "gpg"},
        "rollout": {"n": 4},
        "actor": {"loss": {"name": "gpg", "agg_mode": "token-mean", "kl_loss_coef": 0.0}},
    },
    # GMPO (Zhao et al. 2025): geometric-mean ratio, log-ratio clipped to [-0.4, 0.4].
    "gmpo": {
        "algorithm": {"adv_estimator": "grpo"},
        "rollout": {"n": 4},
        "actor": {
            "loss": {
                "name": "geo_mean",
                "clip_ratio_low": 0.4,
                "clip_ratio_high": 0.4,
                "kl_loss_coef": 0.0,
            }
        },
    },
    # SAPO (Gao et al. 2025): soft gate with the paper's temperatures, per-sequence means.
    "sapo": {
        "algorithm": {"adv_estimator": "grpo"},
        "rollout": {"n": 4},
        "actor": {
            "loss": {
                "name": "sapo",
                "tau_pos": 1.0,
                "tau_neg": 1.05,
                "agg_mode": "seq-mean-token-mean",
                "kl_loss_coef": 0.0,
            }
        },
    },
    # Clip-Cov (Cui et al. 2025): DAPO's recipe with covariance-based gradient detaching.
    "clip_cov": {
        "algorithm": {"adv_estimator": "grpo"},
        "rollout": {"n": 4},
        "actor": {
            "loss": {
                "name": "clip_cov",
                "clip_ratio_low": 0.2,
                "clip_ratio_high": 0.2,
                "clip_cov_ratio": 0.0002,
                "clip_cov_lb": 1.0,
                "clip_cov_ub": 5.0,
                "agg_mode": "token-mean",
                "kl_loss_coef": 0.0,
            }
        },
    },
    # KL-Cov (Cui et al. 2025): a KL penalty on the top-covariance tokens.
    "kl_cov": {
        "algorithm": {"adv_estimator": "grpo"},
        "rollout": {"n": 4},
        "actor": {
            "loss": {
                "name": "kl_cov",
                "kl_cov_ratio": 0.0002,
                "ppo_kl_coef": 1.0,
                "agg_mode": "token-mean",
                "kl_loss_coef": 0.0,
            }
        },
    },
    # DPPO (arXiv:2602.04879), Binary-TV trust region; a large TIS truncation (Sec. 5.4).
    "dppo": {
        "algorithm": {"adv_estimator": "grpo"},
        "rollout": {"n": 4},
        "actor": {
            "loss": {
                "name": "dppo_tv",
                "clip_ratio_low": 0.2,
                "clip_ratio_high": 0.2,
                "clip_ratio_c": 20.0,
                "agg_mode": "token-mean",
                "kl_loss_coef": 0.0,
            }
        },
    },
    # OPO (Hao et al. 2025): length-weighted baseline, no KL (the paper also trains exactly
    # on-policy: one mini-batch per step, actor.mini_batch_size = data.train_batch_size).
    "opo": {
        "algorithm": {"adv_estimator": "opo"},
        "rollout": {"n": 4},
        "actor": {"loss": {"name": "ppo", "agg_mode": "token-mean", "kl_loss_coef": 0.0}},
    },
    # ReMax (Li et al. 2023): the greedy response's reward as the baseline, one sample.
    "remax": {
        "algorithm": {"adv_estimator": "remax"},
        "rollout": {"n": 1},
        "actor": {"loss": {"name": "ppo", "kl_loss_coef": 0.0}},
    },
}

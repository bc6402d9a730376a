"""RL algorithms (PPO, GRPO, DAPO, GSPO), rewards, the single-controller trainer and the `rl` CLI.

Attributes load on first use: reward worker processes import this package and must not
pay for torch, Ray or transformers.
"""

from __future__ import annotations

from importlib.metadata import version as _version

from rl_algos._lazy import lazy_attributes
from rl_core.compat import require_core as _require_core

_require_core("rl-algos")  # the installed rl-core must fit the declared range
__version__ = _version("rl-algos")

_EXPORTS = {
    "ADVANTAGE_ESTIMATORS": "rl_algos.advantages",
    "POLICY_LOSSES": "rl_algos.losses",
    "PolicyLossConfig": "rl_algos.losses",
    "RLConfig": "rl_algos.config",
    "RLTrainer": "rl_algos.trainer.loop",
    "RewardManager": "rl_algos.rewards",
    "RolloutCorrectionConfig": "rl_algos.rollout_correction",
    "ValueLossConfig": "rl_algos.losses",
    "compute_advantage": "rl_algos.advantages",
    "load_config": "rl_algos.config",
    "make_actor_loss_fn": "rl_algos.losses",
    "make_critic_loss_fn": "rl_algos.losses",
}

__all__, __getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS, ("__version__",))

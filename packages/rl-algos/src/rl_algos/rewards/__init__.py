"""Rewards: built-in and user reward functions (`rl.rewards`), the `RewardManager` scoring
batches in time-limited processes, and `GenerativeJudge`. Attributes load lazily: scoring
workers import the reward modules through this package without torch or rl_core.
"""

from __future__ import annotations

from rl_algos._lazy import lazy_attributes

_EXPORTS = {
    "CallResult": "rl_algos.rewards.pool",
    "DATA_SOURCE_ALIASES": "rl_algos.rewards.registry",
    "FileRewardFunction": "rl_algos.rewards.user_function",
    "GenerativeJudge": "rl_algos.rewards.judge",
    "JudgeError": "rl_algos.rewards.judge",
    "JudgeParseError": "rl_algos.rewards.judge",
    "JudgeTimeoutError": "rl_algos.rewards.judge",
    "OverlongBuffer": "rl_algos.rewards.manager",
    "REWARDS": "rl_algos.rewards.registry",
    "RewardManager": "rl_algos.rewards.manager",
    "RewardOutput": "rl_algos.rewards.manager",
    "ScoringPool": "rl_algos.rewards.pool",
    "default_compute_score": "rl_algos.rewards.registry",
    "load_reward_function": "rl_algos.rewards.registry",
    "parse_judgment": "rl_algos.rewards.judge",
    "reward_for_data_source": "rl_algos.rewards.registry",
}

__all__, __getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)

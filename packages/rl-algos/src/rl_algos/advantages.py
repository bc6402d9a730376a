"""Advantage estimators: pure functions on [batch, response_length] tensors.

Estimators (`ADVANTAGE_ESTIMATORS`, entry points ``rl.advantage_estimators``) take
keyword arguments only and ignore those they do not need::

    advantages, returns = estimator(
        token_level_rewards=...,  # [B, R] rewards (the score sits on the last response token)
        response_mask=...,        # [B, R] 1 on tokens that enter the loss
        index=...,                # [B] numpy array of group ids (`uid`): samples of one prompt
        values=...,               # [B, R] critic values (GAE only)
        reward_baselines=...,     # [B] reward of the greedy sample (ReMax only)
        gamma=1.0, lam=1.0, epsilon=1e-6, norm_adv_by_std_in_grpo=True,
    )

Names and semantics follow verl: a group of one sample has baseline 0 (and std 1 for GRPO).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rl_algos.masked import masked_whiten
from rl_core.registry import Registry

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageEstimator",
    "compute_advantage",
    "compute_dr_grpo_advantage",
    "compute_gae_advantage_return",
    "compute_gpg_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_advantage",
    "compute_opo_advantage",
    "compute_reinforce_plus_plus_advantage",
    "compute_reinforce_plus_plus_baseline_advantage",
    "compute_remax_advantage",
    "compute_rloo_advantage",
    "group_ids",
]

AdvantageEstimator = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry(
    "rl.advantage_estimators", kind="advantage estimator"
)


def group_ids(index: Any, device: torch.device | None = None) -> tuple[torch.Tensor, int]:
    """Map group ids (any hashable values, e.g. uid strings) to 0..G-1; returns (ids, G)."""
    seen: dict[Any, int] = {}
    ids = [seen.setdefault(key, len(seen)) for key in np.asarray(index, dtype=object).tolist()]
    return torch.tensor(ids, dtype=torch.long, device=device), len(seen)


def _require(name: str, value: Any, estimator: str) -> Any:
    if value is None:
        raise ValueError(f"advantage estimator {estimator!r} needs {name!r}, got None")
    return value


def _check_shapes(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> None:
    if token_level_rewards.dim() != 2 or token_level_rewards.shape != response_mask.shape:
        raise ValueError(
            "token_level_rewards and response_mask must both be [batch, response_length]; got "
            f"{tuple(token_level_rewards.shape)} and {tuple(response_mask.shape)}"
        )


def _scores(rewards: torch.Tensor, mask: torch.Tensor, index: Any, name: str) -> torch.Tensor:
    """Each sample's score [B] (its summed token rewards), for a group estimator."""
    _check_shapes(rewards, mask)
    _require("index", index, name)
    return rewards.sum(dim=-1)


def _group_stats(
    scores: torch.Tensor, index: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample (group mean, unbiased group std, group size) of `scores` [B]."""
    if len(index) != scores.shape[0]:
        raise ValueError(f"index has {len(index)} entries but the batch has {scores.shape[0]}")
    gid, num_groups = group_ids(index, scores.device)
    count = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device)
    count.index_add_(0, gid, torch.ones_like(scores))
    total = torch.zeros_like(count).index_add_(0, gid, scores)
    mean = total / count
    sq_dev = torch.zeros_like(count).index_add_(0, gid, (scores - mean[gid]) ** 2)
    std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))
    return mean[gid], std[gid], count[gid]


@torch.no_grad()
def compute_gae_advantage_return(
    *,
    token_level_rewards: torch.Tensor,
    values: torch.Tensor | None = None,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2016) -> (whitened advantages, raw advantages + values); masked
    tokens (padding, tool output) are skipped, carrying value and advantage across."""
    _check_shapes(token_level_rewards, response_mask)
    values = _require("values", values, "gae")
    mask = response_mask.to(values.dtype)
    next_value = torch.zeros_like(values[:, 0])
    running = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        step = delta + gamma * lam * running
        m = mask[:, t]
        running = m * step + (1 - m) * running
        next_value = m * values[:, t] + (1 - m) * next_value
        advantages[:, t] = running
    returns = advantages + values
    return masked_whiten(advantages, mask) * mask, returns * mask


@torch.no_grad()
def compute_grpo_outcome_advantage(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: (score - group mean) / (group std + epsilon), broadcast over response tokens.
    `norm_adv_by_std_in_grpo=False` drops the division (Dr.GRPO's estimator)."""
    scores = _scores(token_level_rewards, response_mask, index, "grpo")
    mean, std, count = _group_stats(scores, index)
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    adv = scores - mean
    if norm_adv_by_std_in_grpo:
        adv = adv / (std + epsilon)
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


def compute_dr_grpo_advantage(**kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr.GRPO (Liu et al. 2025): GRPO without the std division. Pair it with the
    `seq-mean-token-sum-norm` loss aggregation (the `dr_grpo` preset does)."""
    kwargs["norm_adv_by_std_in_grpo"] = False
    return compute_grpo_outcome_advantage(**kwargs)


@torch.no_grad()
def compute_rloo_advantage(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None, **_: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024): score minus the mean score of the other samples of
    the same prompt; a group of one keeps its score."""
    scores = _scores(token_level_rewards, response_mask, index, "rloo")
    mean, _, count = _group_stats(scores, index)
    leave_one_out = (mean * count - scores) / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, scores - leave_one_out, scores)
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


def _discounted_returns(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """G_t = r_t + gamma * G_next over mask-1 tokens, right to left; a masked token (tool
    output, padding) passes the return through undiscounted (verl #7278) and holds 0."""
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    mask = response_mask.bool()
    for t in reversed(range(token_level_rewards.shape[1])):
        stepped = token_level_rewards[:, t] + gamma * running
        running = torch.where(mask[:, t], stepped, running)
        returns[:, t] = torch.where(mask[:, t], running, torch.zeros_like(running))
    return returns


@torch.no_grad()
def compute_reinforce_plus_plus_advantage(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0, **_: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (arXiv:2501.03262): discounted token returns (`_discounted_returns`),
    whitened over all response tokens of the batch."""
    _check_shapes(token_level_rewards, response_mask)
    returns = _discounted_returns(token_level_rewards, response_mask, gamma)
    mask = response_mask.to(returns.dtype)
    return masked_whiten(returns, mask) * mask, returns


@torch.no_grad()
def compute_reinforce_plus_plus_baseline_advantage(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None, **_: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline: score minus its group mean, then whitened over the batch."""
    scores = _scores(token_level_rewards, response_mask, index, "reinforce_plus_plus_baseline")
    mean, _, count = _group_stats(scores, index)
    centred = scores - torch.where(count > 1, mean, torch.zeros_like(mean))
    mask = response_mask.to(scores.dtype)
    adv = centred.unsqueeze(-1) * mask
    adv = masked_whiten(adv, mask) * mask
    return adv, adv


@torch.no_grad()
def compute_remax_advantage(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    reward_baselines: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023): undiscounted reward-to-go minus the greedy sample's reward."""
    _check_shapes(token_level_rewards, response_mask)
    baselines = _require("reward_baselines", reward_baselines, "remax")
    mask = response_mask.to(token_level_rewards.dtype)
    returns = (token_level_rewards * mask).flip(-1).cumsum(-1).flip(-1)
    adv = returns - baselines.to(returns.dtype).unsqueeze(-1) * mask
    return adv, returns


@torch.no_grad()
def compute_opo_advantage(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None, **_: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (arXiv:2505.23585): A_i = R_i - sum_j |o_j| R_j / sum_j |o_j| over the group
    (|o_j|: response tokens of sample j)."""
    scores = _scores(token_level_rewards, response_mask, index, "opo")
    _, _, count = _group_stats(scores, index)  # checks the index's length too
    lengths = response_mask.to(scores.dtype).sum(dim=-1)
    gid, num_groups = group_ids(index, scores.device)
    weighted = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device)
    weighted.index_add_(0, gid, lengths * scores)
    total_len = torch.zeros_like(weighted).index_add_(0, gid, lengths)
    baseline = (weighted / total_len.clamp(min=1))[gid]
    baseline = torch.where(count > 1, baseline, torch.zeros_like(baseline))
    adv = (scores - baseline).unsqueeze(-1) * response_mask
    return adv, adv


@torch.no_grad()
def compute_gpg_advantage(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None, **_: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (arXiv:2504.02546): A_i = (B / M) * (R_i - group mean), B samples, M of them
    with a non-zero score (at least 1), F_norm = 1, as verl computes it."""
    scores = _scores(token_level_rewards, response_mask, index, "gpg")
    mean, _, count = _group_stats(scores, index)
    mean = torch.where(count > 1, mean, torch.zeros_like(mean))
    nonzero = torch.count_nonzero(scores).clamp(min=1).to(scores.dtype)
    alpha = scores.shape[0] / nonzero
    adv = (alpha * (scores - mean)).unsqueeze(-1) * response_mask
    return adv, adv


@torch.no_grad()
def compute_grpo_passk_advantage(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO pass@k (arXiv:2503.19595): only each group's best sample learns, with
    A = (R_max - R_second) / (std + epsilon) (std only if `norm_adv_by_std_in_grpo`);
    others and ties get 0. Groups need >= 2 samples."""
    scores = _scores(token_level_rewards, response_mask, index, "grpo_passk")
    _, std, count = _group_stats(scores, index)
    gid, num_groups = group_ids(index, scores.device)
    if bool((count < 2).any()):
        lone = np.asarray(index, dtype=object)[(count < 2).cpu().numpy()][0]
        raise ValueError(
            f"advantage estimator 'grpo_passk' needs >= 2 samples per group (rollout.n >= 2); "
            f"group {lone!r} has 1"
        )
    adv = torch.zeros_like(scores)
    for g in range(num_groups):
        rows = torch.nonzero(gid == g).flatten()
        top = torch.topk(scores[rows], 2)
        gap = top.values[0] - top.values[1]
        best = rows[top.indices[0]]
        adv[best] = gap / (std[best] + epsilon) if norm_adv_by_std_in_grpo else gap
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


def _episode_advantage(data: Any, fn: Any, params: dict[str, Any]) -> torch.Tensor:
    """Estimate over episodes as sequences of steps (step reward: its row's summed
    rewards); step t's estimate goes to every response token of its row."""
    nt, batch = data.non_tensor_batch, data.batch
    episodes, ep = np.unique(np.asarray(nt["episode_index"], np.int64), return_inverse=True)
    t = np.asarray(nt["episode_step"], np.int64)
    shape = (len(episodes), int(t.max()) + 1)
    rewards = torch.zeros(shape, dtype=torch.float32)  # whatever torch's default dtype
    mask = torch.zeros_like(rewards)
    rewards[ep, t] = (batch["token_level_rewards"] * batch["response_mask"]).sum(-1).float()
    mask[ep, t] = 1.0
    uids = np.empty(len(episodes), dtype=object)
    uids[ep] = nt["uid"]
    adv, _ = fn(token_level_rewards=rewards, response_mask=mask, index=uids, **params)
    return adv[ep, t].unsqueeze(-1) * batch["response_mask"]


def compute_advantage(data: Any, estimator: str, **params: Any) -> Any:
    """Run the named estimator on `data` (its batch fields and ``uid``) and store
    `advantages` and `returns`; `params`: gamma, lam, norm_adv_by_std_in_grpo, epsilon.
    Rows with ``episode_index``/``episode_step`` (VLA) are estimated per episode."""
    batch = data.batch
    keys = set(batch.keys())  # older TensorDicts refuse `key in td`
    fn = ADVANTAGE_ESTIMATORS.get(estimator)
    if "episode_index" in data.non_tensor_batch:
        batch["advantages"] = batch["returns"] = _episode_advantage(data, fn, params)
        return data
    advantages, returns = fn(
        token_level_rewards=batch["token_level_rewards"],
        response_mask=batch["response_mask"],
        values=batch["values"] if "values" in keys else None,
        reward_baselines=batch["reward_baselines"] if "reward_baselines" in keys else None,
        index=data.non_tensor_batch.get("uid"),
        **params,
    )
    batch["advantages"] = advantages
    batch["returns"] = returns
    return data

"""Advantage estimators against hand computations and plain-Python references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rl_algos.advantages import ADVANTAGE_ESTIMATORS

EPS = 1e-6


def outcome_rewards(scores, lengths, width):
    """[B, R] rewards with each score on the last valid token, and the response mask."""
    rewards = torch.zeros(len(scores), width, dtype=torch.float64)
    mask = torch.zeros(len(scores), width, dtype=torch.float64)
    for i, (score, length) in enumerate(zip(scores, lengths)):
        mask[i, :length] = 1
        rewards[i, length - 1] = score
    return rewards, mask


def uids(*names):
    return np.array(list(names), dtype=object)


def test_builtin_estimators_resolve_through_entry_points():
    names = set(ADVANTAGE_ESTIMATORS.names())
    assert {
        "gae",
        "grpo",
        "dr_grpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
    } <= names
    assert ADVANTAGE_ESTIMATORS.get("grpo").__name__ == "compute_grpo_outcome_advantage"


def test_grpo_by_hand_with_singleton_and_constant_groups():
    rewards, mask = outcome_rewards([1, 0, 1, 0.5, 2, 2], [3, 2, 1, 3, 2, 3], 4)
    index = uids("a", "a", "a", "b", "c", "c")
    adv, ret = ADVANTAGE_ESTIMATORS.get("grpo")(
        token_level_rewards=rewards, response_mask=mask, index=index
    )
    std_a = math.sqrt(1 / 3)  # unbiased std of (1, 0, 1)
    expected = [
        (1 - 2 / 3) / (std_a + EPS),
        (0 - 2 / 3) / (std_a + EPS),
        (1 - 2 / 3) / (std_a + EPS),
        0.5 / (1 + EPS),  # a group of one: mean 0, std 1 (verl)
        0.0,  # all-equal rewards: no signal
        0.0,
    ]
    for i, value in enumerate(expected):
        assert adv[i] == pytest.approx((mask[i] * value).tolist(), abs=1e-9)
    assert torch.equal(adv, ret)


def test_grpo_without_std_and_dr_grpo_are_mean_centred_only():
    rewards, mask = outcome_rewards([3, 1, 0, 4], [2, 2, 2, 2], 2)
    index = uids(7, 7, 9, 9)
    kwargs = dict(token_level_rewards=rewards, response_mask=mask, index=index)
    no_std, _ = ADVANTAGE_ESTIMATORS.get("grpo")(norm_adv_by_std_in_grpo=False, **kwargs)
    dr, _ = ADVANTAGE_ESTIMATORS.get("dr_grpo")(**kwargs)
    expected = torch.tensor([[1, 1], [-1, -1], [-2, -2], [2, 2]], dtype=torch.float64)
    assert torch.allclose(no_std, expected)
    assert torch.allclose(dr, expected)


def test_rloo_is_score_minus_mean_of_the_others():
    rewards, mask = outcome_rewards([1, 2, 6, 5, 3], [1, 2, 3, 1, 2], 3)
    index = uids("x", "x", "x", "y", "z")
    adv, _ = ADVANTAGE_ESTIMATORS.get("rloo")(
        token_level_rewards=rewards, response_mask=mask, index=index
    )
    expected = [1 - 4, 2 - 3.5, 6 - 1.5, 5, 3]  # singletons keep their score
    assert adv.sum(-1) / mask.sum(-1) == pytest.approx(expected)
    assert torch.equal(adv * (1 - mask), torch.zeros_like(adv))


def test_gae_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.2, 0.1]], dtype=torch.float64)
    mask = torch.ones_like(rewards)
    adv, ret = ADVANTAGE_ESTIMATORS.get("gae")(
        token_level_rewards=rewards, values=values, response_mask=mask, gamma=1.0, lam=1.0
    )
    # deltas: -0.3, -0.1, 0.9 -> raw advantages 0.5, 0.8, 0.9; returns = adv + values = 1
    assert ret[0].tolist() == pytest.approx([1.0, 1.0, 1.0])
    raw = torch.tensor([0.5, 0.8, 0.9], dtype=torch.float64)
    whitened = (raw - raw.mean()) / torch.sqrt(raw.var(unbiased=True) + 1e-8)
    assert adv[0].tolist() == pytest.approx(whitened.tolist())


def gae_reference(rewards, values, mask, gamma, lam):
    """Per sample, GAE over the valid tokens only (masked tokens are skipped entirely)."""
    raw = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        idx = [t for t in range(rewards.shape[1]) if mask[i, t] == 1]
        adv = 0.0
        for k in reversed(range(len(idx))):
            t = idx[k]
            next_value = values[i, idx[k + 1]].item() if k + 1 < len(idx) else 0.0
            delta = rewards[i, t].item() + gamma * next_value - values[i, t].item()
            adv = delta + gamma * lam * adv
            raw[i, t] = adv
    returns = raw + values
    flat = raw[mask == 1]
    whitened = (raw - flat.mean()) / torch.sqrt(flat.var(unbiased=True) + 1e-8)
    return whitened * mask, returns * mask


def test_gae_skips_masked_tokens_like_a_per_sample_reference():
    torch.manual_seed(0)
    rewards = torch.randn(3, 6, dtype=torch.float64)
    values = torch.randn(3, 6, dtype=torch.float64)
    # sample 1 has a masked "tool output" span in the middle; sample 2 is right-padded
    mask = torch.tensor(
        [[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.float64
    )
    adv, ret = ADVANTAGE_ESTIMATORS.get("gae")(
        token_level_rewards=rewards, values=values, response_mask=mask, gamma=0.9, lam=0.8
    )
    ref_adv, ref_ret = gae_reference(rewards, values, mask, 0.9, 0.8)
    assert torch.allclose(adv, ref_adv)
    assert torch.allclose(ret, ref_ret)


def test_gae_needs_values():
    rewards, mask = outcome_rewards([1], [2], 2)
    with pytest.raises(ValueError, match="'gae' needs 'values'"):
        ADVANTAGE_ESTIMATORS.get("gae")(token_level_rewards=rewards, response_mask=mask)


def test_reinforce_plus_plus_discounts_and_ignores_rewards_on_padding():
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    adv, ret = ADVANTAGE_ESTIMATORS.get("reinforce_plus_plus")(
        token_level_rewards=rewards, response_mask=mask, gamma=0.5
    )
    # row 0: G2 = 2, G1 = 0 + 0.5*2 = 1, G0 = 1 + 0.5 = 1.5
    # row 1: the reward 9 sits on a padding token: it is not a step and does not flow back
    assert ret[0].tolist() == pytest.approx([1.5, 1.0, 2.0])
    assert ret[1, :2].tolist() == pytest.approx([1.5, 3.0])
    valid = torch.tensor([1.5, 1.0, 2.0, 1.5, 3.0], dtype=torch.float64)
    expected = (valid - valid.mean()) / torch.sqrt(valid.var(unbiased=True) + 1e-8)
    assert adv[mask == 1].tolist() == pytest.approx(expected.tolist())
    assert adv[1, 2] == 0


def test_reinforce_plus_plus_baseline_subtracts_group_mean_then_whitens():
    rewards, mask = outcome_rewards([1, 3, 5, 2], [2, 1, 2, 2], 2)
    index = uids("g", "g", "h", "s")
    adv, ret = ADVANTAGE_ESTIMATORS.get("reinforce_plus_plus_baseline")(
        token_level_rewards=rewards, response_mask=mask, index=index
    )
    # centred: g -> -1, +1 ; h (singleton) -> 5 ; s (singleton) -> 2, per valid token
    valid = torch.tensor([-1, -1, 1, 5, 5, 2, 2], dtype=torch.float64)
    expected = (valid - valid.mean()) / torch.sqrt(valid.var(unbiased=True) + 1e-8)
    assert adv[mask == 1].tolist() == pytest.approx(expected.tolist())
    assert torch.equal(adv, ret)


def test_remax_reward_to_go_minus_greedy_baseline():
    rewards = torch.tensor([[0.0, 1.0, 2.0], [4.0, 0.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    baselines = torch.tensor([0.5, 1.0], dtype=torch.float64)
    adv, ret = ADVANTAGE_ESTIMATORS.get("remax")(
        token_level_rewards=rewards, response_mask=mask, reward_baselines=baselines
    )
    assert ret.tolist() == [[3.0, 3.0, 2.0], [4.0, 0.0, 0.0]]
    assert adv.tolist() == [[2.5, 2.5, 1.5], [3.0, -1.0, 0.0]]


def test_group_estimators_need_index_and_matching_lengths():
    rewards, mask = outcome_rewards([1, 2], [1, 1], 1)
    with pytest.raises(ValueError, match="needs 'index'"):
        ADVANTAGE_ESTIMATORS.get("grpo")(token_level_rewards=rewards, response_mask=mask)
    with pytest.raises(ValueError, match="index has 3 entries but the batch has 2"):
        ADVANTAGE_ESTIMATORS.get("rloo")(
            token_level_rewards=rewards, response_mask=mask, index=uids("a", "a", "b")
        )
    with pytest.raises(ValueError, match=r"\[batch, response_length\]"):
        ADVANTAGE_ESTIMATORS.get("grpo")(
            token_level_rewards=rewards, response_mask=mask[:, :0], index=uids("a", "a")
        )


def test_compute_advantage_on_a_dataproto():
    from rl_algos.advantages import compute_advantage
    from rl_core import DataProto

    rewards, mask = outcome_rewards([1.0, 0.0, 4.0], [2, 1, 2], 2)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": ["p", "p", "q"]},
    )
    compute_advantage(data, "grpo", norm_adv_by_std_in_grpo=False)
    assert data.batch["advantages"].tolist() == [[0.5, 0.5], [-0.5, 0.0], [4.0, 4.0]]
    assert torch.equal(data.batch["returns"], data.batch["advantages"])
    with pytest.raises(KeyError, match=r"unknown advantage estimator 'gpro'.*did you mean 'grpo'"):
        compute_advantage(data, "gpro")

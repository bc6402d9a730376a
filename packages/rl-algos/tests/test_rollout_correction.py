"""Rollout correction by hand: each mode's weights, rejection mask and metrics recomputed
here token by token in Python floats (math.exp / math.log, not the implementation), the
veto, decoupled PPO's zero lower bound, its composition with the losses, and the refusals.
verl 0.9 itself checks the same functions in test_verl_oracle_rollout_correction.py."""

from __future__ import annotations

import math
import re

import pytest
import torch

from rl_algos.aggregation import LossScale
from rl_algos.errors import ConfigError
from rl_algos.losses import POLICY_LOSSES, PolicyLossConfig
from rl_algos.rollout_correction import (
    RolloutCorrectionConfig,
    apply_rejection,
    correction_metrics,
    importance_weights,
    partial_is_metrics,
)

# two sequences; log r = log pi_old - log pi_rollout per token, the second row padded
LOG_R = [[0.9, -0.1, 0.2], [-1.6, 0.05, 0.0]]
MASK = [[1, 1, 1], [1, 1, 0]]


def tensors():
    rollout = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -0.7]], dtype=torch.float64)
    old = rollout + torch.tensor(LOG_R, dtype=torch.float64)
    return old, rollout, torch.tensor(MASK, dtype=torch.float64)


def valid(i):
    return [t for t in range(3) if MASK[i][t]]


def weights(config):
    old, rollout, mask = tensors()
    return importance_weights(old, rollout, mask, config).flatten().tolist()


def flat(rows):
    return [x for row in rows for x in row]


def test_token_level_truncated_is():
    w = weights(RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0))
    expected = [[min(math.exp(x), 2.0) * m for x, m in zip(r, mr)] for r, mr in zip(LOG_R, MASK)]
    assert w == pytest.approx(flat(expected))  # e^0.9 = 2.46 is truncated to 2


def test_sequence_level_truncated_is():
    w = weights(RolloutCorrectionConfig(rollout_is="sequence", rollout_is_threshold=2.0))
    seq = [min(math.exp(sum(LOG_R[i][t] for t in valid(i))), 2.0) for i in range(2)]
    assert w == pytest.approx(flat([[seq[i] * m for m in MASK[i]] for i in range(2)]))
    assert seq == pytest.approx([2.0, math.exp(-1.55)])


def test_icepop_and_decoupled_ppo_zero_weights_outside_the_bounds():
    w = weights(RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold="0.5_2.0"))
    assert w == pytest.approx([0.0, math.exp(-0.1), math.exp(0.2), 0.0, math.exp(0.05), 0.0])
    # lower bound 0 (AReaL's decoupled PPO): only the weights above the cap are dropped
    w = weights(RolloutCorrectionConfig.decoupled_ppo(2.0))
    expected = [[0.0, math.exp(-0.1), math.exp(0.2)], [math.exp(-1.6), math.exp(0.05), 0.0]]
    assert w == pytest.approx(flat(expected))


@pytest.mark.parametrize(
    ("option", "threshold", "kept_rows_tokens"),
    [
        # token level, k1 = -log r within [log 1/2, log 2]: |log r| <= 0.693
        ("token_k1", 2.0, [[0, 1, 1], [0, 1, 0]]),
        # k2 = (log r)^2 / 2 <= 0.1: |log r| <= 0.447
        ("token_k2", 0.1, [[0, 1, 1], [0, 1, 0]]),
        # sequence level, sum of k1 = -sum log r: row 0 -1.0, row 1 1.55; bounds log(1/3)..log 3
        ("seq_sum_k1", 3.0, [[1, 1, 1], [0, 0, 0]]),
        # geometric level, mean of k1: row 0 -1/3, row 1 0.775 within log(1/2)..log 2 = 0.693
        ("seq_mean_k1", 2.0, [[1, 1, 1], [0, 0, 0]]),
        # the worst token's k3 = r - 1 - log r: row 0 e^.9 - 1.9 = 0.56, row 1 e^-1.6 + 0.6
        ("seq_max_k3", 0.7, [[1, 1, 1], [0, 0, 0]]),
        ("seq_max_k3", 0.9, [[1, 1, 1], [1, 1, 0]]),
    ],
)
def test_rejection_levels_by_hand(option, threshold, kept_rows_tokens):
    old, rollout, mask = tensors()
    config = RolloutCorrectionConfig(rollout_rs=option, rollout_rs_threshold=threshold)
    new_mask, metrics = correction_metrics(old, rollout, mask, config)
    assert new_mask.tolist() == [
        [k * m for k, m in zip(kr, mr)] for kr, mr in zip(kept_rows_tokens, MASK)
    ]
    rejected = sum(m - k * m for kr, mr in zip(kept_rows_tokens, MASK) for k, m in zip(kr, mr))
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(rejected / 5)
    assert metrics[f"rollout_corr/rollout_rs_{option}_masked_fraction"] == pytest.approx(
        rejected / 5
    )


def test_the_veto_rejects_a_sequence_with_one_catastrophic_token():
    old, rollout, mask = tensors()
    config = RolloutCorrectionConfig(rollout_token_veto_threshold=0.25)  # e^-1.6 = 0.20 < 0.25
    new_mask, metrics = correction_metrics(old, rollout, mask, config)
    assert new_mask.tolist() == [[1, 1, 1], [0, 0, 0]]
    assert metrics["rollout_corr/rollout_is_veto_fraction"] == pytest.approx(1 / 2)
    assert metrics["rollout_corr/rollout_is_catastrophic_token_fraction"] == pytest.approx(1 / 5)
    batch = {"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask}
    apply_rejection(batch, config)
    assert batch["response_mask"].tolist() == [[1, 1, 1], [0, 0, 0]]


def test_is_metrics_by_hand():
    old, rollout, mask = tensors()
    config = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0)
    _, m = correction_metrics(old, rollout, mask, config)
    xs = [LOG_R[i][t] for i in range(2) for t in valid(i)]
    raw = [math.exp(x) for x in xs]
    w = [min(r, 2.0) for r in raw]
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(sum(w) / 5)
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(2.0)
    assert m["rollout_corr/rollout_is_min"] == pytest.approx(math.exp(-1.6))
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 5)
    assert m["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(1 / 5)  # < 1/2
    mean = sum(w) / 5
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(
        1 / (sum((x / mean) ** 2 for x in w) / 5), rel=1e-6
    )
    assert m["rollout_corr/kl"] == pytest.approx(-sum(xs) / 5)
    assert m["rollout_corr/k3_kl"] == pytest.approx(sum(math.exp(x) - x - 1 for x in xs) / 5)
    assert m["rollout_corr/chi2_token"] == pytest.approx(sum(r * r for r in raw) / 5 - 1)
    partial = partial_is_metrics(old, rollout, mask, config, 5, 2)
    for key in ("rollout_is_mean", "rollout_is_ratio_fraction_high", "kl", "k3_kl"):
        assert partial[f"rollout_corr/{key}"] == pytest.approx(m[f"rollout_corr/{key}"])


def test_partial_metrics_sum_over_micro_batches():
    old, rollout, mask = tensors()
    config = RolloutCorrectionConfig(rollout_is="sequence", rollout_is_threshold=2.0)
    whole = partial_is_metrics(old, rollout, mask, config, 5, 2)
    parts = [partial_is_metrics(old[i : i + 1], rollout[i : i + 1], mask[i : i + 1], config, 5, 2)
             for i in range(2)]  # fmt: skip
    for key, value in whole.items():
        assert sum(p[key] for p in parts) == pytest.approx(value), key


def test_the_loss_is_weighted_once_by_the_correction():
    """PPO's ratio is pi / pi_old (the proximal policy); the rollout correction's weight
    pi_old / pi_rollout multiplies it once: the product is the full off-policy ratio."""
    old, rollout, mask = tensors()
    log_prob = (old + 0.05).requires_grad_(True)
    cfg = PolicyLossConfig(
        clip_ratio_low=10.0, clip_ratio_high=10.0,  # no clip: the plain weighted ratio
        rollout_correction=RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=50.0),
    )  # fmt: skip
    loss, _ = POLICY_LOSSES.get("ppo")(
        log_prob=log_prob, old_log_prob=old, advantages=torch.ones_like(old),
        response_mask=mask, config=cfg, scale=LossScale.whole_batch(mask),
        rollout_log_probs=rollout,
    )  # fmt: skip
    full = [math.exp(0.05 + LOG_R[i][t]) for i in range(2) for t in valid(i)]
    assert loss.item() == pytest.approx(-sum(full) / 5)


@pytest.mark.parametrize(
    ("fields", "path", "expected"),
    [
        ({"rollout_is": "tokens"}, "rollout_is", "one of"),
        ({"rollout_is": "token", "rollout_is_threshold": "2_1"}, "rollout_is_threshold", "L <= U"),
        ({"rollout_is": "token", "rollout_is_threshold": "x"}, "rollout_is_threshold", "'L_U'"),
        ({"rollout_rs": "token_k4", "rollout_rs_threshold": 1.0}, "rollout_rs", "comma-separated"),
        ({"rollout_rs": "token_k2"}, "rollout_rs_threshold", "a threshold"),
        ({"rollout_rs": "token_k2", "rollout_rs_threshold": "0.1_2"}, "rollout_rs_threshold", "single"),
        ({"rollout_rs": "token_k2,seq_max_k3", "rollout_rs_threshold": "1,2,3"},
         "rollout_rs_threshold", "one per"),
        ({"rollout_rs_threshold": 1.0}, "rollout_rs_threshold", "null when rollout_rs is null"),
        ({"rollout_rs": "token_k1", "rollout_rs_threshold": 0.5}, "rollout_rs_threshold", "U >= 1"),
        ({"rollout_is": "sequence", "rollout_rs": "token_k1", "rollout_rs_threshold": 2.0},
         "rollout_rs", "sequence-level options"),
        ({"rollout_token_veto_threshold": 1.5}, "rollout_token_veto_threshold", "(0, 1)"),
    ],
)  # fmt: skip
def test_bad_settings_are_refused_with_the_field(fields, path, expected):
    from rl_core.config import build

    with pytest.raises(ConfigError, match=rf"{path}.*{re.escape(expected)}") as info:
        build(RolloutCorrectionConfig, fields, "actor.loss.rollout_correction")
    assert "\n" not in str(info.value)

"""`rl_algos.rollout_correction` against verl 0.9's `rollout_corr_helper` on the same
inputs: the importance weights, the response mask after rejection and every
``rollout_corr/*`` metric verl reports (marker `verl`: nox -s tests-verl-oracle).

The veto (verl 0.6-0.7) and IcePop with a lower bound of 0 (decoupled PPO) are not in verl
0.9; test_rollout_correction.py checks them by hand."""

from __future__ import annotations

import importlib
import os

import pytest
import torch

from rl_algos.rollout_correction import (
    RolloutCorrectionConfig,
    correction_metrics,
    importance_weights,
    partial_is_metrics,
)

pytestmark = pytest.mark.verl


@pytest.fixture(scope="module")
def helper():
    try:
        return importlib.import_module("verl.trainer.ppo.rollout_corr_helper")
    except ImportError as exc:
        if os.environ.get("RL_VERL_ORACLE"):
            raise
        pytest.skip(f"verl is installed only in `nox -s tests-verl-oracle` ({exc})")


def make_inputs(seed: int, spread: float):
    g = torch.Generator().manual_seed(seed)
    rows, length = 8, 9
    rollout = -torch.rand(rows, length, generator=g, dtype=torch.float64) * 3 - 0.05
    old = rollout + torch.randn(rows, length, generator=g, dtype=torch.float64) * spread
    mask = torch.zeros(rows, length, dtype=torch.float64)
    for i, n in enumerate([9, 1, 4, 9, 6, 3, 0, 7]):  # row 6: no valid token
        mask[i, :n] = 1.0
    return old, rollout, mask


IS_CASES = [(None, 2.0), ("token", 2.0), ("token", 1.3), ("sequence", 2.0), ("sequence", 5.0)]
IS_CASES += [("token", "0.5_2.0"), ("sequence", "0.2_3.0")]
RS_CASES = [
    (None, None),
    ("token_k1", 2.0),
    ("token_k1", "0.6_1.5"),
    ("token_k2", 0.05),
    ("token_k3", 0.05),
    ("seq_sum_k1", "0.3_4.0"),
    ("seq_sum_k2", 0.3),
    ("seq_sum_k3", 0.3),
    ("seq_mean_k1", 1.2),
    ("seq_mean_k2", 0.02),
    ("seq_mean_k3", 0.02),
    ("seq_max_k2", 0.1),
    ("seq_max_k3", 0.1),
    ("token_k3,seq_mean_k1", "0.05,1.2"),
    ("seq_sum_k2,seq_max_k3", 0.2),
]
CASES = [
    (is_level, is_thr, rs, rs_thr, seed, spread)
    for is_level, is_thr in IS_CASES
    for rs, rs_thr in RS_CASES
    if not (is_level == "sequence" and rs is not None and "token" in rs)  # refused here
    for seed, spread in ((0, 0.3), (1, 0.6))
]


@pytest.mark.parametrize(("is_level", "is_thr", "rs", "rs_thr", "seed", "spread"), CASES)
def test_weights_mask_and_metrics_match_verl(helper, is_level, is_thr, rs, rs_thr, seed, spread):
    old, rollout, mask = make_inputs(seed, spread)
    config = RolloutCorrectionConfig(
        rollout_is=is_level, rollout_is_threshold=is_thr, rollout_rs=rs, rollout_rs_threshold=rs_thr
    )
    verl_weights, verl_mask, verl_metrics = helper.compute_rollout_correction_and_rejection_mask(
        old_log_prob=old, rollout_log_prob=rollout, response_mask=mask,
        rollout_is=is_level, rollout_is_threshold=is_thr, rollout_rs=rs,
        rollout_rs_threshold=rs_thr,
    )  # fmt: skip
    our_mask, our_metrics = correction_metrics(old, rollout, mask, config)
    torch.testing.assert_close(our_mask, verl_mask, rtol=0, atol=0)
    weights = importance_weights(old, rollout, mask, config)
    if is_level is None:
        assert weights is None and verl_weights is None
    else:
        torch.testing.assert_close(weights, verl_weights.batch["rollout_is_weights"])
    assert set(our_metrics) == set(verl_metrics), set(our_metrics) ^ set(verl_metrics)
    for key, value in verl_metrics.items():
        assert our_metrics[key] == pytest.approx(float(value), rel=1e-7, abs=1e-10), key
    # the loss's summable partials (one micro-batch = the batch) are verl's values too
    partial = partial_is_metrics(old, rollout, mask, config, int(mask.sum()), mask.shape[0])
    for key, value in partial.items():
        assert value == pytest.approx(float(verl_metrics[key]), rel=1e-7, abs=1e-10), key

"""Our policy losses against verl 0.9's `core_algos` on the same inputs: the loss, its
gradient and every metric verl reports, under verl's names (marker `verl`; verl is
installed only in `nox -s tests-verl-oracle`, pinned there).

verl is an independent implementation here: nothing of ours is called on verl's side. The
inputs are float64 with padding, mixed-sign per-sequence advantages and ratios on both
sides of the clip bounds, so every clip branch is taken. The tolerance (relative 1e-7) is
verl's own: it divides by ``length + 1e-8`` in the per-sequence means.
"""

from __future__ import annotations

import importlib
import math
import os

import pytest
import torch

from rl_algos.aggregation import LossScale
from rl_algos.losses import POLICY_LOSSES, PolicyLossConfig
from rl_algos.rollout_correction import RolloutCorrectionConfig

pytestmark = pytest.mark.verl

VERL_VERSION = "0.9."
# ours -> verl's registry name (`reinforce` is verl's compute_policy_loss_reinforce, which
# verl reaches through its bypass mode rather than the registry)
LOSSES = {
    "ppo": "vanilla",
    "gspo": "gspo",
    "sapo": "sapo",
    "gpg": "gpg",
    "clip_cov": "clip_cov",
    "kl_cov": "kl_cov",
    "geo_mean": "geo_mean",
    "dro": "dro",
    "cispo": "cispo",
    "dppo_tv": "dppo_tv",
    "dppo_kl": "dppo_kl",
    "reinforce": None,
}
AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean"]
AGG_MODES.append("seq-mean-token-sum-norm")
# verl's SAPO always aggregates with seq-mean-token-mean (ours honours agg_mode: the paper's
# aggregation is the `sapo` preset); GMPO is a sequence mean in both whatever the mode.
ONLY_AGG = {"sapo": ["seq-mean-token-mean"], "geo_mean": ["token-mean"]}
# loss-specific settings that give every branch tokens on these inputs
EXTRA = {
    "clip_cov": {"clip_cov_ratio": 0.2, "clip_cov_lb": 0.0, "clip_cov_ub": 5.0},
    "kl_cov": {"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.5},
    "dro": {"dro_beta": 0.3},
    "dppo_tv": {"clip_ratio_low": 0.05, "clip_ratio_high": 0.05, "clip_ratio_c": 1.3},
    "dppo_kl": {"clip_ratio_low": 0.02, "clip_ratio_high": 0.02, "clip_ratio_c": 1.3},
    "cispo": {"clip_ratio_low": 10.0, "clip_ratio_high": 0.2},
    "sapo": {"tau_pos": 1.0, "tau_neg": 1.05},
}


@pytest.fixture(scope="module")
def verl():
    """verl's core_algos and config classes; a missing verl fails in the oracle session."""
    try:
        core_algos = importlib.import_module("verl.trainer.ppo.core_algos")
        actor = importlib.import_module("verl.workers.config.actor")
        version = importlib.import_module("verl").__version__
    except ImportError as exc:
        if os.environ.get("RL_VERL_ORACLE"):
            raise
        pytest.skip(f"verl is installed only in `nox -s tests-verl-oracle` ({exc})")
    assert version.startswith(VERL_VERSION), version
    return core_algos, actor


def make_inputs(seed: int, rows: int = 6, length: int = 7):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, length, generator=g, dtype=torch.float64) * 3 - 0.05
    log_prob = old + torch.randn(rows, length, generator=g, dtype=torch.float64) * 0.35
    rollout = old + torch.randn(rows, length, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(rows, 1, generator=g, dtype=torch.float64).expand(rows, length).clone()
    adv[2] = 0.0  # a prompt group with one reward: zero advantage
    lengths = [length, 1, 4, length, 5, 3]
    mask = torch.zeros(rows, length, dtype=torch.float64)
    for i, n in enumerate(lengths[:rows]):
        mask[i, :n] = 1.0
    return log_prob, old, rollout, adv, mask


def verl_config(actor, name, verl_name, agg_mode, low, high, c, extra):
    policy = {
        k: extra[k] for k in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio")
        if k in extra
    }  # fmt: skip
    policy["ppo_kl_coef"] = extra.get("ppo_kl_coef", 0.1)
    policy["dro_beta"] = extra.get("dro_beta")
    return actor.FSDPActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=low,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=c,
        loss_agg_mode=agg_mode,
        tau_pos=extra.get("tau_pos", 1.0),
        tau_neg=extra.get("tau_neg", 1.05),
        policy_loss=actor.PolicyLossConfig(loss_mode=verl_name or "vanilla", **policy),
    )


def run_verl(core_algos, cfg, verl_name, log_prob, old, rollout, adv, mask, agg, is_weights):
    lp = log_prob.clone().requires_grad_(True)
    if verl_name is None:
        loss, metrics = core_algos.compute_policy_loss_reinforce(
            rollout_log_prob=rollout, log_prob=lp, advantages=adv, response_mask=mask,
            loss_agg_mode=agg, config=cfg, rollout_is_weights=is_weights,
        )  # fmt: skip
    else:
        fn = core_algos.get_policy_loss_fn(verl_name)
        loss, metrics = fn(
            old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask,
            loss_agg_mode=agg, config=cfg, rollout_is_weights=is_weights,
        )  # fmt: skip
    loss.backward()
    return float(loss.detach()), metrics, lp.grad


def run_ours(name, cfg, log_prob, old, rollout, adv, mask):
    lp = log_prob.clone().requires_grad_(True)
    loss, metrics = POLICY_LOSSES.get(name)(
        log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, config=cfg,
        scale=LossScale.whole_batch(mask, float(mask.shape[-1])), rollout_log_probs=rollout,
    )  # fmt: skip
    loss.backward()
    return float(loss.detach()), metrics, lp.grad


CASES = [
    (name, agg, tis, seed)
    for name in LOSSES
    for agg in ONLY_AGG.get(name, AGG_MODES)
    for tis in (None, 1.5)
    for seed in (0, 1)
]


@pytest.mark.parametrize(("name", "agg", "tis", "seed"), CASES)
def test_loss_gradient_and_metrics_match_verl(verl, name, agg, tis, seed):
    core_algos, actor = verl
    verl_name = LOSSES[name]
    extra = EXTRA.get(name, {})
    low = extra.get("clip_ratio_low", 0.2)
    high = extra.get("clip_ratio_high", 0.28)
    c = extra.get("clip_ratio_c", 3.0)
    log_prob, old, rollout, adv, mask = make_inputs(seed)
    if name == "reinforce" and tis is None:
        old = rollout  # verl's bypass mode: the rollout's log-probs are the old ones
    # verl takes precomputed truncated IS weights; ours computes them from rollout_log_probs
    is_weights = None if tis is None else torch.exp(old - rollout).clamp(max=tis) * mask
    cfg = PolicyLossConfig(
        name=name, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c, agg_mode=agg,
        agg_norm_constant=float(mask.shape[-1]),
        rollout_correction=None if tis is None else RolloutCorrectionConfig.tis(tis),
        **{k: v for k, v in extra.items() if not k.startswith("clip_ratio")},
    )  # fmt: skip
    vcfg = verl_config(actor, name, verl_name, agg, low, high, c, extra)

    torch.manual_seed(1234)  # Clip-Cov's random draw: the same stream on both sides
    v_loss, v_metrics, v_grad = run_verl(
        core_algos, vcfg, verl_name, log_prob, old, rollout, adv, mask, agg, is_weights
    )
    torch.manual_seed(1234)
    behaviour = rollout if tis is not None or name == "reinforce" else None
    o_loss, o_metrics, o_grad = run_ours(name, cfg, log_prob, old, behaviour, adv, mask)
    assert o_loss == pytest.approx(v_loss, rel=1e-7, abs=1e-10)
    torch.testing.assert_close(o_grad, v_grad, rtol=1e-7, atol=1e-10)
    for key, value in v_metrics.items():
        assert key in o_metrics, f"{name}: verl reports {key}, we do not"
        assert o_metrics[key] == pytest.approx(float(value), rel=1e-7, abs=1e-10), key


def test_every_verl_policy_loss_is_compared(verl):
    core_algos, _ = verl
    compared = {v for v in LOSSES.values() if v is not None}
    # bypass_mode is verl's rollout correction without old log-probs, not a loss of its own
    assert set(core_algos.POLICY_LOSS_REGISTRY) - {"bypass_mode"} == compared
    assert all(name in POLICY_LOSSES.names() for name in LOSSES)


def test_the_inputs_take_every_branch(verl):
    log_prob, old, _, adv, mask = make_inputs(0)
    ratio = torch.exp(log_prob - old)[mask.bool()]
    assert (ratio > 1.28).any() and (ratio < 0.8).any() and (ratio > 3.0).sum() >= 0
    assert (adv[mask.bool()] > 0).any() and (adv[mask.bool()] < 0).any()
    assert math.isclose(float(mask.sum()), 7 + 1 + 4 + 7 + 5 + 3)

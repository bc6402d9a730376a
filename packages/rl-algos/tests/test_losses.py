"""Policy, value, entropy and KL losses against hand computations."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from rl_algos.aggregation import LossScale
from rl_algos.errors import ConfigError
from rl_algos.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_penalty,
    make_kl_controller,
)
from rl_algos.losses import (
    POLICY_LOSSES,
    PolicyLossConfig,
    ValueLossConfig,
    compute_value_loss,
    make_actor_loss_fn,
    make_critic_loss_fn,
)
from rl_algos.rollout_correction import RolloutCorrectionConfig, partial_is_metrics


def ppo(log_ratios, advantages, mask=None, **config):
    old = torch.zeros(1, len(log_ratios), dtype=torch.float64)
    log_prob = torch.tensor([log_ratios], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([advantages], dtype=torch.float64)
    mask = torch.ones_like(adv) if mask is None else torch.tensor([mask], dtype=torch.float64)
    cfg = PolicyLossConfig(**config)
    loss, metrics = POLICY_LOSSES.get(cfg.name)(
        log_prob=log_prob,
        old_log_prob=old,
        advantages=adv,
        response_mask=mask,
        config=cfg,
        scale=LossScale.whole_batch(mask),
    )
    loss.backward()
    return loss.item(), metrics, log_prob.grad[0].tolist()


def test_policy_losses_resolve_by_name():
    assert {"ppo", "vanilla", "gspo"} <= set(POLICY_LOSSES.names())
    assert POLICY_LOSSES.get("vanilla") is POLICY_LOSSES.get("ppo")


def test_ppo_clip_and_dual_clip_by_hand():
    ratios = [1.5, 0.5, 5.0, 0.5, 1.1]
    advs = [1.0, 1.0, -1.0, -1.0, 2.0]
    loss, metrics, grad = ppo([math.log(r) for r in ratios], advs)
    # per token: clipped to 1.2 -> -1.2; unclipped -0.5; dual-clip: min(max(5, 1.2), 3) = 3;
    # clipped to 0.8 for A<0 -> 0.8; unclipped -2.2
    per_token = [-1.2, -0.5, 3.0, 0.8, -2.2]
    assert loss == pytest.approx(sum(per_token) / 5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 5)  # tokens 0 and 3
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 5)  # token 2
    assert metrics["actor/ppo_kl"] == pytest.approx(-sum(math.log(r) for r in ratios) / 5)
    # d loss / d log_prob = -A * ratio / 5 where nothing is clipped, 0 where clipped
    assert grad == pytest.approx([0.0, -0.5 / 5, 0.0, 0.0, -2.2 / 5])


def test_clip_higher_widens_only_the_upper_range():
    log_ratio = [math.log(1.25), math.log(0.75)]
    sym, _, _ = ppo(log_ratio, [1.0, -1.0], clip_ratio_low=0.2, clip_ratio_high=0.2)
    dapo, metrics, _ = ppo(log_ratio, [1.0, -1.0], clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert sym == pytest.approx((-1.2 + 0.8) / 2)
    assert dapo == pytest.approx((-1.25 + 0.8) / 2)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 2)


def test_masked_tokens_do_not_contribute():
    loss, metrics, grad = ppo([0.0, 3.0], [1.0, -5.0], mask=[1, 0])
    assert loss == pytest.approx(-1.0)
    assert grad == [-1.0, 0.0]
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_gspo_sequence_ratio_by_hand():
    log_prob = torch.tensor([[0.1, 0.3, 0.0], [0.5, 0.5, 9.0]], dtype=torch.float64)
    log_prob.requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.float64)
    adv = torch.ones(2, 3, dtype=torch.float64)
    cfg = PolicyLossConfig(
        name="gspo", clip_ratio_low=0.3, clip_ratio_high=0.3, agg_mode="seq-mean-token-mean"
    )
    loss, metrics = POLICY_LOSSES.get("gspo")(
        log_prob=log_prob,
        old_log_prob=torch.zeros_like(log_prob),
        advantages=adv,
        response_mask=mask,
        config=cfg,
        scale=LossScale.whole_batch(mask),
    )
    loss.backward()
    s0 = math.exp(0.2)  # geometric mean of token ratios e^0.1, e^0.3: inside [0.7, 1.3]
    # sequence 1: exp(0.5) = 1.65 > 1.3: clipped to 1.3, no gradient (masked 9.0 ignored)
    assert loss.item() == pytest.approx((-s0 - 1.3) / 2)
    expected_grad = [[-s0 / 2 / 2, -s0 / 2 / 2, 0.0], [0.0, 0.0, 0.0]]
    assert torch.allclose(log_prob.grad, torch.tensor(expected_grad, dtype=torch.float64))
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 4)


def test_gspo_clips_sequences_not_tokens():
    """Token ratios e^0.4 and e^-0.4 would each be clipped by PPO; their geometric mean is 1."""
    log_ratio = [0.4, -0.4]
    ppo_loss, ppo_metrics, _ = ppo(log_ratio, [1.0, 1.0])
    gspo_loss, gspo_metrics, grad = ppo(log_ratio, [1.0, 1.0], name="gspo")
    assert gspo_loss == pytest.approx(-1.0)
    assert gspo_metrics["actor/pg_clipfrac"] == 0.0
    assert grad == pytest.approx([-0.5, -0.5])
    assert ppo_metrics["actor/pg_clipfrac"] == pytest.approx(1 / 2)
    assert ppo_loss == pytest.approx((-1.2 - math.exp(-0.4)) / 2)


def test_truncated_importance_sampling_weights_are_capped_and_detached():
    log_prob = torch.tensor([[-1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    rollout = torch.tensor([[-2.0, -0.5]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.float64)
    cfg = PolicyLossConfig(rollout_correction=RolloutCorrectionConfig.tis(2.0))
    loss, _ = POLICY_LOSSES.get("ppo")(
        log_prob=log_prob,
        old_log_prob=old,
        advantages=torch.ones(1, 2, dtype=torch.float64),
        response_mask=mask,
        config=cfg,
        scale=LossScale.whole_batch(mask),
        rollout_log_probs=rollout,
    )
    weights = [min(math.exp(1.0), 2.0), math.exp(-0.5)]
    assert loss.item() == pytest.approx(-(weights[0] + weights[1]) / 2)
    partial = partial_is_metrics(old, rollout, mask, cfg.rollout_correction, 2, 1)
    assert partial["rollout_corr/rollout_is_mean"] == pytest.approx(sum(weights) / 2)
    assert partial["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 2)
    loss.backward()
    assert rollout.grad is None
    assert log_prob.grad[0].tolist() == pytest.approx([-weights[0] / 2, -weights[1] / 2])
    with pytest.raises(ValueError, match="no 'rollout_log_probs'"):
        POLICY_LOSSES.get("ppo")(
            log_prob=log_prob,
            old_log_prob=old,
            advantages=torch.ones(1, 2, dtype=torch.float64),
            response_mask=mask,
            config=cfg,
            scale=LossScale.whole_batch(mask),
        )


def test_value_loss_clipping_by_hand():
    vpreds = torch.tensor([[1.0, 2.0, 1.9, 7.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.5, 1.0, 0.0]], dtype=torch.float64)
    returns = torch.tensor([[1.0, 0.0, 3.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.float64)
    loss, metrics = compute_value_loss(
        vpreds, values, returns, mask, 0.5, "token-mean", LossScale.whole_batch(mask)
    )
    # token 0: clipped v = 1.0 -> 0; token 1: max(4, (1.0-0)^2=1) = 4;
    # token 2: max((1.9-3)^2 = 1.21, (1.5-3)^2 = 2.25) = 2.25 (clipped); token 3 masked
    assert loss.item() == pytest.approx(0.5 * (0 + 4 + 2.25) / 3)
    assert metrics["critic/vf_clipfrac"] == pytest.approx(1 / 3)


def test_kl_estimators_by_hand():
    logp = torch.tensor([-1.0, -2.0, 30.0])
    ref = torch.tensor([-1.5, -1.0, 0.0])
    d = logp - ref
    assert kl_penalty(logp, ref, "k1").tolist() == pytest.approx(d.tolist())
    assert kl_penalty(logp, ref, "kl").tolist() == pytest.approx(d.tolist())
    assert kl_penalty(logp, ref, "k2").tolist() == pytest.approx((0.5 * d**2).tolist())
    assert kl_penalty(logp, ref, "mse").tolist() == pytest.approx((0.5 * d**2).tolist())
    assert kl_penalty(logp, ref, "abs").tolist() == pytest.approx(d.abs().tolist())
    k3 = kl_penalty(logp, ref, "k3").tolist()
    assert k3[0] == pytest.approx(math.exp(-0.5) + 0.5 - 1)
    assert k3[1] == pytest.approx(math.exp(1.0) - 1.0 - 1)
    assert k3[2] == 10.0  # log ratio -30 clamped to -20 -> 19, then clamped to 10
    assert kl_penalty(logp, ref, "low_var_kl").tolist() == k3
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_penalty(logp, ref, "k4")


def test_k1_and_k3_are_unbiased_estimates_of_the_true_kl():
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    true_kl = float((p * (p / q).log()).sum())
    x = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    logp, logq = p.log()[x], q.log()[x]
    for kind in ("k1", "k3"):
        assert kl_penalty(logp, logq, kind).mean().item() == pytest.approx(true_kl, rel=0.03)
    assert (kl_penalty(logp, logq, "k3") >= 0).all()


def test_kl_controllers():
    fixed = make_kl_controller("fixed", 0.1)
    fixed.update(5.0, 100)
    assert fixed.value == 0.1
    adaptive = make_kl_controller("adaptive", 0.1, target_kl=0.05, horizon=100)
    adaptive.update(current_kl=0.1, n_steps=10)  # error clipped to +0.2
    assert adaptive.value == pytest.approx(0.1 * 1.02)
    adaptive.update(current_kl=0.045, n_steps=50)  # error -0.1
    assert adaptive.value == pytest.approx(0.1 * 1.02 * 0.95)
    restored = AdaptiveKLController(1.0, 0.05, 100)
    restored.load_state_dict(adaptive.state_dict())
    assert restored.value == adaptive.value
    assert isinstance(make_kl_controller("fixed", 0.2), FixedKLController)
    with pytest.raises(ValueError, match="target_kl and horizon"):
        make_kl_controller("adaptive", 0.1)
    with pytest.raises(ValueError, match="'fixed' or 'adaptive'"):
        make_kl_controller("pid", 0.1)


def test_apply_kl_penalty_in_reward():
    scores = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    old = torch.tensor([[-1.0, -1.0], [-1.0, -3.0]])
    ref = torch.tensor([[-1.5, -1.0], [-2.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    ctrl = FixedKLController(0.5)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, ctrl, "k1")
    assert torch.allclose(rewards, torch.tensor([[-0.25, 1.0], [-0.5, 0.0]]))
    # per-sequence mean KL: (0.5 + 0) / 2 and 1 / 1 -> batch mean 0.625
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.625)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5


def test_policy_loss_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"clip_ratio_c: invalid value 0.5; expected > 1"):
        PolicyLossConfig(clip_ratio_c=0.5)
    with pytest.raises(ConfigError, match="did you mean 'token-mean'"):
        PolicyLossConfig(agg_mode="token_mean")
    with pytest.raises(ConfigError, match="cliprange_value"):
        ValueLossConfig(cliprange_value=0)


def micro_batch(**tensors):
    batch = TensorDict(tensors, batch_size=[next(iter(tensors.values())).shape[0]])
    return SimpleNamespace(batch=batch, meta_info={})


def ctx_for(mask, num_micro_batches=1):
    return SimpleNamespace(
        global_num_tokens=int(mask.sum()),
        global_num_seqs=mask.shape[0],
        dp_size=1,
        micro_batch_index=0,
        num_micro_batches=num_micro_batches,
    )


def test_actor_loss_fn_combines_policy_entropy_and_kl_terms():
    torch.manual_seed(0)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    old = -torch.rand(2, 3)
    ref = -torch.rand(2, 3)
    adv = torch.randn(2, 3)
    log_prob = (old + 0.1 * torch.randn(2, 3)).requires_grad_(True)
    entropy = torch.rand(2, 3)
    cfg = PolicyLossConfig(entropy_coeff=0.01, kl_loss_coef=0.1, kl_loss_type="k3")
    loss_fn = make_actor_loss_fn(cfg)
    mb = micro_batch(old_log_probs=old, ref_log_prob=ref, advantages=adv, response_mask=mask)
    loss, metrics = loss_fn({"log_probs": log_prob, "entropy": entropy}, mb, ctx_for(mask))

    scale = LossScale.whole_batch(mask)
    pg, _ = POLICY_LOSSES.get("ppo")(
        log_prob=log_prob,
        old_log_prob=old,
        advantages=adv,
        response_mask=mask,
        config=cfg,
        scale=scale,
    )
    ent = (entropy * mask).sum() / mask.sum()
    kl = (kl_penalty(log_prob, ref, "k3") * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx((pg - 0.01 * ent + 0.1 * kl).item())
    assert metrics["actor/entropy"] == pytest.approx(ent.item())
    assert metrics["actor/kl_loss"] == pytest.approx(kl.item())
    loss.backward()
    assert log_prob.grad is not None


def test_actor_loss_fn_names_missing_fields():
    mask = torch.ones(1, 2)
    loss_fn = make_actor_loss_fn(PolicyLossConfig(kl_loss_coef=0.1))
    mb = micro_batch(
        old_log_probs=torch.zeros(1, 2), advantages=torch.zeros(1, 2), response_mask=mask
    )
    with pytest.raises(KeyError, match=r"no 'ref_log_prob' \(needed for loss\.kl_loss_coef\)"):
        loss_fn({"log_probs": torch.zeros(1, 2)}, mb, ctx_for(mask))
    loss_fn = make_actor_loss_fn(PolicyLossConfig(entropy_coeff=0.1))
    with pytest.raises(KeyError, match="returned no 'entropy'"):
        loss_fn({"log_probs": torch.zeros(1, 2)}, mb, ctx_for(mask))


def test_critic_loss_fn_matches_value_loss():
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    values, returns = torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([[1.0, 1.0, 1.0]])
    vpreds = torch.tensor([[0.2, 2.0, 5.0]])
    loss_fn = make_critic_loss_fn(ValueLossConfig(cliprange_value=0.5))
    loss, metrics = loss_fn(
        {"values": vpreds},
        micro_batch(values=values, returns=returns, response_mask=mask),
        ctx_for(mask),
    )
    # token 0: max(0.64, 0.64) ; token 1: max(1.0, 0.25) = 1.0
    assert loss.item() == pytest.approx(0.5 * (0.64 + 1.0) / 2)
    assert metrics["critic/vf_loss"] == pytest.approx(loss.item())


def test_decoupled_ppo_weights_by_behaviour_ratio_and_drops_tokens_above_the_cap():
    """AReaL's decoupled PPO: the clip is around the proximal policy (old_log_prob) and each
    token is weighted by pi_prox / pi_behav; a token whose weight exceeds the cap is dropped."""
    log_prob = torch.tensor([[-1.0, -1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0, -1.0, -1.0]], dtype=torch.float64)
    rollout = torch.tensor([[-1.5, -0.7, -2.0]], dtype=torch.float64)  # w = e^.5, e^-.3, e^1
    mask = torch.ones(1, 3, dtype=torch.float64)
    cfg = PolicyLossConfig(rollout_correction=RolloutCorrectionConfig.decoupled_ppo(2.0))
    loss, _ = POLICY_LOSSES.get("ppo")(
        log_prob=log_prob,
        old_log_prob=old,
        advantages=torch.ones(1, 3, dtype=torch.float64),
        response_mask=mask,
        config=cfg,
        scale=LossScale.whole_batch(mask),
        rollout_log_probs=rollout,
    )
    weights = [math.exp(0.5), math.exp(-0.3), 0.0]  # e^1 > 2: dropped
    assert loss.item() == pytest.approx(-sum(weights) / 3)
    partial = partial_is_metrics(old, rollout, mask, cfg.rollout_correction, 3, 1)
    assert partial["rollout_corr/rollout_is_mean"] == pytest.approx(sum(weights) / 3)
    assert partial["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(1 / 3)  # dropped
    loss.backward()
    assert log_prob.grad[0].tolist() == pytest.approx([-w / 3 for w in weights])
    with pytest.raises(ConfigError, match="rollout_is_threshold"):
        RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold="3_2")

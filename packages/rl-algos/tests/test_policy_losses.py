"""The policy losses of rl_algos.policy_losses, the straight-through KL kinds and token-sum:
hand-worked numbers on 2-4 tokens, float64 re-derivations written here from the papers'
formulas (token by token, not by calling the implementation), clip boundaries and masks."""

from __future__ import annotations

import math

import pytest
import torch

from rl_algos.aggregation import LossScale, agg_loss
from rl_algos.errors import ConfigError
from rl_algos.kl import kl_penalty
from rl_algos.losses import POLICY_LOSSES, PolicyLossConfig

NEW = ["clip_cov", "kl_cov", "gpg", "geo_mean", "cispo", "sapo", "dppo_tv", "dppo_kl", "dro"]
NEW.append("reinforce")
DETERMINISTIC = ["gpg", "geo_mean", "cispo", "sapo", "dppo_tv", "dppo_kl", "dro", "reinforce"]


def run(name, log_prob, old_log_prob, advantages, mask=None, **config):
    """(loss, metrics, d loss / d log_prob) for one row (a list) or rows (lists of lists)."""
    rows = log_prob if isinstance(log_prob[0], list) else [log_prob]
    wrap = (lambda x: x) if isinstance(log_prob[0], list) else (lambda x: [x])
    lp = torch.tensor(rows, dtype=torch.float64, requires_grad=True)
    old = torch.tensor(wrap(old_log_prob), dtype=torch.float64)
    adv = torch.tensor(wrap(advantages), dtype=torch.float64)
    m = torch.ones_like(adv) if mask is None else torch.tensor(wrap(mask), dtype=torch.float64)
    cfg = PolicyLossConfig(name=name, **config)
    loss, metrics = POLICY_LOSSES.get(name)(
        log_prob=lp,
        old_log_prob=old,
        advantages=adv,
        response_mask=m,
        config=cfg,
        scale=LossScale.whole_batch(m),
    )
    loss.backward()
    grad = lp.grad if isinstance(log_prob[0], list) else lp.grad[0]
    return loss.item(), metrics, grad.tolist()


def test_every_new_loss_resolves_by_name():
    assert set(NEW) <= set(POLICY_LOSSES.names())


# ----------------------------------------------------------------------------- by hand


@pytest.mark.parametrize("name", ["gpg", "reinforce"])
def test_plain_policy_gradient_by_hand(name):
    # -A log pi = [-(1)(-1), -(-0.5)(-2)] = [1, -1]; the third token is masked out
    loss, _, grad = run(name, [-1.0, -2.0, -9.0], [0.0, 0.0, 0.0], [1.0, -0.5, 50.0], [1, 1, 0])
    assert loss == pytest.approx(0.0)
    assert grad == pytest.approx([-0.5, 0.25, 0.0])  # -A / 2 tokens


def test_cispo_by_hand_keeps_the_gradient_of_clipped_tokens():
    ratios, advs = [1.5, 0.5, 1.1], [1.0, -1.0, 2.0]
    lp = [math.log(r) for r in ratios]
    # no lower bound (eps_low = 10), eps_high = 0.2: weights sg(clip(r)) = [1.2, 0.5, 1.1]
    loss, metrics, grad = run("cispo", lp, [0.0] * 3, advs, clip_ratio_low=10, clip_ratio_high=0.2)
    w = [1.2, 0.5, 1.1]
    assert loss == pytest.approx(sum(-w[i] * advs[i] * lp[i] for i in range(3)) / 3)
    assert grad == pytest.approx([-w[i] * advs[i] / 3 for i in range(3)])  # PPO would give 0
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 3)


def test_sapo_by_hand_at_ratio_one():
    # r = 1: f = (4 / tau) sigmoid(0) = 2 / tau; df/dlog pi = 4 sigma (1 - sigma) r = 1
    loss, _, grad = run("sapo", [-0.7, -1.3], [-0.7, -1.3], [1.0, -1.0], tau_pos=1.0, tau_neg=1.05)
    assert loss == pytest.approx((-2 / 1.0 + 2 / 1.05) / 2)
    assert grad == pytest.approx([-0.5, 0.5])


def test_sapo_gate_is_soft_not_a_hard_clip():
    # far outside PPO's range the gradient decays but stays non-zero and smooth
    _, _, grad = run("sapo", [math.log(2.0)], [0.0], [1.0], tau_pos=1.0)
    s = 1 / (1 + math.exp(-1.0))  # sigmoid(tau (r - 1)) with r = 2
    assert grad == pytest.approx([-4 * s * (1 - s) * 2.0])


def test_dro_by_hand():
    # -(A log pi - 0.5 beta (log pi - log pi_old)^2), beta = 0.5
    loss, _, grad = run("dro", [-1.0, -0.5], [-1.5, -0.5], [2.0, 1.0], dro_beta=0.5)
    assert loss == pytest.approx((-(-2.0 - 0.25 * 0.25) + 0.5) / 2)
    assert grad == pytest.approx([-(2.0 - 0.5 * 0.5) / 2, -1.0 / 2])


def test_geo_mean_by_hand():
    # seq 0 (A = 1): d = [0.5, -0.1] -> pessimistic clip to [0.4, -0.1] -> R = exp(0.15)
    # seq 1 (A = -1): d = [-0.6, 0.2] -> [-0.4, 0.2] -> R = exp(-0.1)
    lp = [[0.5, -0.1], [-0.6, 0.2]]
    loss, metrics, grad = run(
        "geo_mean",
        lp,
        [[0, 0], [0, 0]],
        [[1, 1], [-1, -1]],
        clip_ratio_low=0.4,
        clip_ratio_high=0.4,
    )
    assert loss == pytest.approx((-math.exp(0.15) + math.exp(-0.1)) / 2)
    # d/d log pi_t = -A R / |o| / num_seqs where the token is not clipped, else 0
    assert grad[0] == pytest.approx([0.0, -math.exp(0.15) / 2 / 2])
    assert grad[1] == pytest.approx([0.0, math.exp(-0.1) / 2 / 2])
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 4)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 4)


def test_dppo_tv_by_hand_and_at_the_boundary():
    # p_old = 0.5; p = 0.8 (A > 0, +0.3 > 0.2: out), 0.6 (in), p = 0.2 (A < 0, -0.3: out),
    # p = 0.4 (in); boundary p - p_old = exactly -0.25 with eps_low = 0.25 -> in
    p_old, p = [0.5, 0.5, 0.5, 0.5, 0.5], [0.8, 0.6, 0.2, 0.4, 0.25]
    advs = [1.0, 1.0, -1.0, -1.0, -1.0]
    lp, old = [math.log(x) for x in p], [math.log(x) for x in p_old]
    loss, metrics, grad = run(
        "dppo_tv", lp, old, advs, clip_ratio_low=0.25, clip_ratio_high=0.2, clip_ratio_c=20.0
    )
    inside = [0, 1, 0, 1, 1]
    w = [p[i] / p_old[i] for i in range(5)]
    assert loss == pytest.approx(sum(-advs[i] * w[i] * lp[i] * inside[i] for i in range(5)) / 5)
    assert grad == pytest.approx([-advs[i] * w[i] * inside[i] / 5 for i in range(5)])
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 5)


def test_dppo_truncates_the_importance_weight():
    # r = 0.25 / 0.1 = 2.5 > clip_ratio_c = 2 -> weight 2 (p - p_old = 0.15 is inside)
    lp, old = [math.log(0.25)], [math.log(0.1)]
    loss, metrics, grad = run("dppo_tv", lp, old, [1.0], clip_ratio_high=0.2, clip_ratio_c=2.0)
    assert loss == pytest.approx(-2.0 * math.log(0.25))
    assert grad == pytest.approx([-2.0])
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1.0)


def test_dppo_kl_by_hand():
    def bkl(p_old, p):
        return p_old * math.log(p_old / p) + (1 - p_old) * math.log((1 - p_old) / (1 - p))

    # A > 0: p rises 0.5 -> 0.8: D = 0.2231 > 0.1 -> out; p falls 0.5 -> 0.2: always in
    # A < 0: p falls 0.5 -> 0.4: D = 0.0204 <= 0.1 -> in; p rises 0.5 -> 0.9 -> in
    p, p_old, advs = [0.8, 0.2, 0.4, 0.9], [0.5] * 4, [1.0, 1.0, -1.0, -1.0]
    assert bkl(0.5, 0.8) > 0.1 > bkl(0.5, 0.4)
    lp, old = [math.log(x) for x in p], [math.log(x) for x in p_old]
    loss, _, grad = run(
        "dppo_kl", lp, old, advs, clip_ratio_low=0.1, clip_ratio_high=0.1, clip_ratio_c=20.0
    )
    inside = [0, 1, 1, 1]
    w = [p[i] / p_old[i] for i in range(4)]
    assert loss == pytest.approx(sum(-advs[i] * w[i] * lp[i] * inside[i] for i in range(4)) / 4)
    assert grad == pytest.approx([-advs[i] * w[i] * inside[i] / 4 for i in range(4)])


# ----------------------------------------------------------------------------- Clip-Cov / KL-Cov


def test_clip_cov_detaches_the_one_token_in_the_covariance_window():
    # mean A = 0.5, mean log pi = -1: cov = (A - 0.5)(log pi + 1) = [1.5*1.5, 0.5*(-0.5)..]
    lp = [0.5, -1.5, -1.0, -2.0]
    advs = [2.0, 0.0, 1.0, -1.0]
    cov = [(a - 0.5) * (x + 1.0) for a, x in zip(advs, lp)]  # [2.25, 0.25, 0, 1.5]
    assert [c for c in cov if 1.0 < c < 5.0] == [2.25, 1.5]
    # token 3 (cov 1.5) is clipped by PPO (r = e^-0.5 < 0.8 with A < 0), so only token 0 is a
    # candidate; ratio 0.5 of 4 tokens = 2 but just one candidate -> token 0 detached
    old = [0.5, -1.5, -1.0, -1.5]
    loss, metrics, grad = run(
        "clip_cov", lp, old, advs, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_cov_ratio=0.5
    )
    ppo_loss, _, ppo_grad = run("ppo", lp, old, advs, clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert ppo_grad[3] == 0.0 and ppo_grad[0] != 0.0
    assert grad[0] == 0.0
    assert grad[1:] == pytest.approx(ppo_grad[1:])
    assert loss == pytest.approx(ppo_loss - (-2.0 * 1.0) / 4)  # token 0's -A r removed
    assert metrics["actor/clip_cov_frac"] == pytest.approx(1 / 4)


def test_clip_cov_draws_its_tokens_with_randperm_from_the_global_rng():
    gen = torch.Generator().manual_seed(5)
    lp = (torch.randn(3, 6, generator=gen, dtype=torch.float64) * 2).tolist()
    advs = (torch.randn(3, 6, generator=gen, dtype=torch.float64) * 2).tolist()
    mask = [[1, 1, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1], [1, 0, 1, 1, 1, 0]]
    cfg = dict(clip_cov_ratio=0.2, clip_cov_lb=0.05, clip_cov_ub=50.0)
    # candidates re-derived here: valid tokens with cov in (lb, ub) (r = 1: nothing clipped)
    flat = [(i, j) for i in range(3) for j in range(6) if mask[i][j]]
    mean_a = sum(advs[i][j] for i, j in flat) / len(flat)
    mean_l = sum(lp[i][j] for i, j in flat) / len(flat)
    candidates = [
        (i, j) for i, j in flat if 0.05 < (advs[i][j] - mean_a) * (lp[i][j] - mean_l) < 50.0
    ]
    count = max(int(0.2 * len(flat)), 1)
    assert len(candidates) > count  # a real draw
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        expected = {candidates[k] for k in torch.randperm(len(candidates))[:count].tolist()}
        torch.manual_seed(seed)
        _, _, grad = run("clip_cov", lp, lp, advs, mask, **cfg)
        detached = {(i, j) for i, j in flat if grad[i][j] == 0.0}
        assert detached == expected
    torch.manual_seed(0)
    first = run("clip_cov", lp, lp, advs, mask, **cfg)[2]
    torch.manual_seed(0)
    assert run("clip_cov", lp, lp, advs, mask, **cfg)[2] == first  # seeded: reproducible


def test_kl_cov_penalises_the_top_covariance_tokens_only():
    # old = log pi - 0.1 on every token, so |log pi - log pi_old| = 0.1
    lp = [0.5, -1.5, -1.0, -2.0, 3.0]
    old = [x - 0.1 for x in lp]
    advs = [2.0, 0.0, 1.0, -1.0, 9.0]
    mask = [1, 1, 1, 1, 0]  # the masked token would have the largest covariance
    loss, metrics, grad = run("kl_cov", lp, old, advs, mask, kl_cov_ratio=0.25, ppo_kl_coef=2.0)
    # valid cov = [2.25, 0.25, 0, 1.5] -> k = floor(0.25 * 4) = 1 -> token 0
    r = math.exp(0.1)
    surrogate = [-a * r for a in advs[:4]]
    assert loss == pytest.approx((sum(surrogate) + 2.0 * 0.1) / 4)
    # d/d log pi: -A r / 4, plus coef * sign(log pi - old) / 4 on token 0
    assert grad[:4] == pytest.approx([(-2 * r + 2.0) / 4, 0.0, -r / 4, r / 4])
    assert grad[4] == 0.0
    assert metrics["actor/kl_cov_frac"] == pytest.approx(1 / 4)


# ----------------------------------------------------------------------------- references


def reference_token_loss(name, lp, old, a, cfg):
    """One token's loss from the paper's formula, in float64 torch scalars."""
    ratio = torch.exp(lp - old)
    low, high = cfg.clip_ratio_low, cfg.clip_ratio_high
    if name in ("gpg", "reinforce"):
        return -a * lp
    if name == "cispo":
        w = min(max(ratio.item(), 1 - low), 1 + high)
        return -w * a * lp
    if name == "sapo":
        tau = cfg.tau_pos if a > 0 else cfg.tau_neg
        return -(4 / tau) * torch.sigmoid(tau * (ratio - 1)) * a
    if name == "dro":
        return -(a * lp - 0.5 * cfg.dro_beta * (lp - old) ** 2)
    p, p_old = math.exp(lp.item()), math.exp(old.item())
    if name == "dppo_tv":
        inside = (p - p_old <= high) if a > 0 else (p - p_old >= -low)
    else:
        d = p_old * math.log(p_old / p) + (1 - p_old) * math.log((1 - p_old) / (1 - p))
        inside = (d <= high or p <= p_old) if a > 0 else (d <= low or p >= p_old)
    return -a * min(ratio.item(), cfg.clip_ratio_c) * lp * float(inside)


def reference_loss(name, lp, old, adv, mask, cfg):
    """The mini-batch loss, token by token (agg_mode token-mean; GMPO per sequence)."""
    rows, width = len(adv), len(adv[0])
    if name == "geo_mean":
        total = 0.0
        for i in range(rows):
            valid = [j for j in range(width) if mask[i][j]]
            if not valid:
                continue
            logs, advs = [], []
            for j in valid:
                d = lp[i][j] - old[i][j]
                c = torch.clamp(d, -cfg.clip_ratio_low, cfg.clip_ratio_high)
                s = 1.0 if adv[i][j] > 0 else (-1.0 if adv[i][j] < 0 else 0.0)
                logs.append(s * torch.minimum(s * d, s * c))
                advs.append(adv[i][j])
            total = total - sum(advs) / len(valid) * torch.exp(sum(logs) / len(valid))
        return total / rows
    terms = [
        reference_token_loss(name, lp[i][j], old[i][j], adv[i][j], cfg)
        for i in range(rows)
        for j in range(width)
        if mask[i][j]
    ]
    return sum(terms) / len(terms)


@pytest.mark.parametrize("name", DETERMINISTIC)
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_a_float64_re_derivation(name, seed):
    gen = torch.Generator().manual_seed(seed)
    rows, width = 3, 5
    old = torch.log(torch.rand(rows, width, generator=gen, dtype=torch.float64) * 0.9 + 0.05)
    lp0 = old + 0.4 * torch.randn(rows, width, generator=gen, dtype=torch.float64)
    lp0 = lp0.clamp(max=-1e-3)  # probabilities below 1
    adv = torch.randn(rows, width, generator=gen, dtype=torch.float64)
    mask = [[1, 1, 0, 1, 1], [1, 0, 0, 1, 0], [1, 1, 1, 1, 1]]  # mid-response zeros
    config = dict(clip_ratio_low=0.15, clip_ratio_high=0.25, clip_ratio_c=1.5, dro_beta=0.7)
    config.update(tau_pos=1.3, tau_neg=0.8)
    cfg = PolicyLossConfig(name=name, **config)
    loss, _, grad = run(name, lp0.tolist(), old.tolist(), adv.tolist(), mask, **config)

    leaves = [[lp0[i, j].clone().requires_grad_(True) for j in range(width)] for i in range(rows)]
    ref = reference_loss(name, leaves, old, adv.tolist(), mask, cfg)
    ref.backward()
    assert loss == pytest.approx(ref.item(), rel=1e-10, abs=1e-12)
    for i in range(rows):
        for j in range(width):
            expected = 0.0 if leaves[i][j].grad is None else leaves[i][j].grad.item()
            assert grad[i][j] == pytest.approx(expected, rel=1e-9, abs=1e-12)
            if not mask[i][j]:
                assert grad[i][j] == 0.0


@pytest.mark.parametrize("name", NEW)
def test_masked_tokens_are_ignored(name):
    """Changing anything on a masked token changes neither the loss nor other gradients."""
    lp = [-0.4, -1.2, -0.9, -0.3]
    old = [-0.5, -1.0, -0.9, -0.6]
    advs = [1.0, -0.5, 2.0, 0.7]
    mask = [1, 1, 0, 1]
    torch.manual_seed(0)
    a = run(name, lp, old, advs, mask)
    torch.manual_seed(0)
    b = run(name, [-0.4, -1.2, -5.0, -0.3], [*old[:2], -0.01, -0.6], [*advs[:2], -40.0, 0.7], mask)
    assert a[0] == pytest.approx(b[0], rel=1e-12)
    assert a[2][2] == 0.0 and b[2][2] == 0.0
    assert [a[2][k] for k in (0, 1, 3)] == pytest.approx([b[2][k] for k in (0, 1, 3)])


# ----------------------------------------------------------------------------- KL and aggregation


@pytest.mark.parametrize(("kind", "base"), [("k1+", "k1"), ("k3+", "k3"), ("low_var_kl+", "k3")])
def test_straight_through_kl_has_the_value_of_its_estimator_and_the_gradient_of_k2(kind, base):
    lp = torch.tensor([-0.2, -1.5, -0.7], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-0.5, -1.0, -0.7], dtype=torch.float64)
    value = kl_penalty(lp, ref, kind)
    d = (lp - ref).detach()
    expected = d if base == "k1" else torch.exp(-d) + d - 1  # k3 = r - log r - 1, r = e^-d
    assert value.tolist() == pytest.approx(expected.tolist(), rel=1e-12)
    value.sum().backward()
    assert lp.grad.tolist() == pytest.approx(d.tolist(), rel=1e-12)  # grad of 0.5 d^2


def test_token_sum_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.float64)
    scale = LossScale(global_num_tokens=99, global_num_seqs=99)  # not used by token-sum
    assert agg_loss(loss, mask, "token-sum", scale).item() == pytest.approx(7.0)


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("clip_cov_ratio", 0.0, "a share of tokens in (0, 1]"),
        ("kl_cov_ratio", 1.5, "a share of tokens in (0, 1]"),
        ("clip_cov_lb", 6.0, "< clip_cov_ub=5.0"),
        ("ppo_kl_coef", -1.0, ">= 0"),
        ("dro_beta", 0.0, "> 0"),
        ("tau_pos", 0.0, "> 0 (a gate temperature)"),
        ("tau_neg", -1.0, "> 0 (a gate temperature)"),
        ("clip_ratio_low", -0.1, ">= 0"),
    ],
)
def test_new_fields_are_validated_with_a_clear_error(field, value, expected):
    with pytest.raises(ConfigError) as err:
        PolicyLossConfig(**{field: value})
    assert err.value.key == field
    assert f"invalid value {value!r}; expected {expected}" in str(err.value)


# ----------------------------------------------------------------------------- verl's metrics


def test_metrics_follow_verls_definitions_by_hand():
    """verl's names and values where they differ from the clipped losses' meaning (the
    oracle session compares them with verl itself); ours are reported beside them."""
    lp, old = [-1.0, -0.5, -2.0], [-1.2, -0.5, -1.0]  # log-ratios 0.2, 0, -1
    _, m, _ = run("kl_cov", lp, old, [1.0, -1.0, 0.5], kl_cov_ratio=0.5)
    assert m["actor/ppo_kl"] == pytest.approx((0.2 + 0.0 + 1.0) / 3)  # mean |log-ratio|
    assert m["actor/ppo_kl_signed"] == pytest.approx((-0.2 + 0.0 + 1.0) / 3)
    for name in ("cispo", "gspo", "sapo"):
        _, m, _ = run(name, lp, old, [1.0, -1.0, 0.5])
        assert m["actor/pg_clipfrac_lower"] == 0.0
    assert run("sapo", lp, old, [1.0, -1.0, 0.5])[1]["actor/pg_clipfrac"] == 0.0
    # reinforce: the KL to the policy that sampled the tokens (verl's bypass semantics)
    lp_t = torch.tensor([lp], dtype=torch.float64)
    rollout = torch.tensor([[-1.1, -0.4, -1.5]], dtype=torch.float64)
    mask = torch.ones_like(lp_t)
    _, m = POLICY_LOSSES.get("reinforce")(
        log_prob=lp_t, old_log_prob=torch.tensor([old], dtype=torch.float64),
        advantages=torch.ones_like(lp_t), response_mask=mask, config=PolicyLossConfig(),
        scale=LossScale.whole_batch(mask), rollout_log_probs=rollout,
    )  # fmt: skip
    assert m["actor/ppo_kl"] == pytest.approx(((-1.1 + 1.0) + (-0.4 + 0.5) + (-1.5 + 2.0)) / 3)


def test_clip_cov_reports_the_detached_share_as_pg_clipfrac():
    # ratios 1.5 (clipped for A > 0), 1.0, 1.0, 1.0; a covariance window that holds tokens
    lp = [math.log(1.5), -1.0, -3.0, -0.2]
    old = [0.0, -1.0, -3.0, -0.2]
    _, m, _ = run("clip_cov", lp, old, [1.0, 2.0, -2.0, 0.1], clip_cov_ratio=0.25,
                  clip_cov_lb=-10.0, clip_cov_ub=10.0)  # fmt: skip
    assert m["actor/pg_clipfrac"] == pytest.approx(1 / 4) == m["actor/clip_cov_frac"]
    assert m["actor/pg_clipfrac_ppo"] == pytest.approx(1 / 4)  # the ratio 1.5 > 1.2

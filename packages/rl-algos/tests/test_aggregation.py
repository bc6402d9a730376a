"""Loss aggregation by hand, and invariance of losses and gradients to DP size and
micro-batch split (partials summed over simulated ranks and micro-batches)."""

from __future__ import annotations

import pytest
import torch

from rl_algos.aggregation import AGG_MODES, LossScale, agg_loss
from rl_algos.kl import kl_penalty
from rl_algos.losses import POLICY_LOSSES, PolicyLossConfig, compute_value_loss

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.float64)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 4) / 3),
        ("token-sum", 1 + 2 + 4),
        ("seq-mean-token-sum", (3 + 4 + 0) / 3),
        ("seq-mean-token-mean", (1.5 + 4 + 0) / 3),  # the empty row counts as a sequence
        ("seq-mean-token-sum-norm", (3 + 4 + 0) / (3 * 4)),  # norm constant 4
    ],
)
def test_modes_by_hand(mode, expected):
    scale = LossScale(global_num_tokens=3, global_num_seqs=3, norm_constant=4)
    assert agg_loss(LOSS, MASK, mode, scale).item() == pytest.approx(expected)


def test_empty_minibatch_gives_zero_not_nan():
    zero = torch.zeros_like(MASK)
    for mode in AGG_MODES:
        value = agg_loss(LOSS, zero, mode, LossScale(0, 0, norm_constant=3)).item()
        assert value == 0.0


def test_bad_mode_and_missing_norm_constant_fail_clearly():
    with pytest.raises(ValueError, match="unknown loss aggregation mode 'token_mean'"):
        agg_loss(LOSS, MASK, "token_mean", LossScale(3, 3))
    with pytest.raises(ValueError, match="needs a positive norm_constant"):
        agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", LossScale(3, 3))


def make_batch(seed=0, batch=12, width=7):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, width + 1, (batch,), generator=gen)
    lengths[0] = width
    mask = (torch.arange(width)[None, :] < lengths[:, None]).double()
    mask[3, 1] = 0  # a masked tool-output token inside a response
    data = {
        "old_log_prob": -torch.rand(batch, width, generator=gen, dtype=torch.float64),
        "ref_log_prob": -torch.rand(batch, width, generator=gen, dtype=torch.float64),
        "advantages": torch.randn(batch, 1, generator=gen, dtype=torch.float64).expand(-1, width),
        "returns": torch.randn(batch, width, generator=gen, dtype=torch.float64),
        "values": torch.randn(batch, width, generator=gen, dtype=torch.float64),
        "response_mask": mask,
    }
    offset = 0.3 * torch.randn(batch, width, generator=gen, dtype=torch.float64)
    return data, offset


def objective(kind, mode, log_prob, data, rows, scale):
    """One micro-batch's partial loss: a policy loss, KL loss or value loss on `rows`,
    trimmed to the micro-batch's own longest response (different padding per micro-batch)."""
    mask = data["response_mask"][rows]
    width = int((mask != 0).any(0).nonzero().max().item()) + 1 if mask.any() else 1
    cut = {k: v[rows][:, :width] for k, v in data.items()}
    lp = log_prob[rows][:, :width]
    if kind in POLICY_KINDS:
        config = PolicyLossConfig(name=kind, agg_mode=mode, clip_ratio_low=0.1, clip_ratio_high=0.2)
        loss, _ = POLICY_LOSSES.get(kind)(
            log_prob=lp,
            old_log_prob=cut["old_log_prob"],
            advantages=cut["advantages"],
            response_mask=cut["response_mask"],
            config=config,
            scale=scale,
        )
        return loss
    if kind in ("kl", "kl+"):
        estimator = "k3" if kind == "kl" else "k3+"
        return agg_loss(
            kl_penalty(lp, cut["ref_log_prob"], estimator), cut["response_mask"], mode, scale
        )
    loss, _ = compute_value_loss(
        lp, cut["values"], cut["returns"], cut["response_mask"], 0.2, mode, scale
    )
    return loss


# the policy losses whose value does not depend on which tokens share a micro-batch
# (Clip-Cov and KL-Cov select tokens within the micro-batch, as their reference does)
POLICY_KINDS = ("ppo", "gspo", "gpg", "geo_mean", "cispo", "sapo", "dppo_tv", "dppo_kl", "dro")
POLICY_KINDS += ("reinforce",)


@pytest.mark.parametrize("kind", [*POLICY_KINDS, "kl", "kl+", "value"])
@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize(
    "layout",
    [
        [[12]],  # one rank, one micro-batch
        [[5, 7]],  # one rank, two uneven micro-batches
        [[3, 3], [2, 4]],  # two DP ranks
        [[1, 1, 2], [4], [3, 1]],  # three DP ranks, ragged split
    ],
)
def test_partials_sum_to_the_full_batch_loss_and_gradient(kind, mode, layout):
    data, offset = make_batch()
    base = data["old_log_prob"] + offset
    mask = data["response_mask"]
    scale = LossScale(int(mask.sum()), mask.shape[0], norm_constant=7)

    full_param = base.clone().requires_grad_(True)
    full = objective(kind, mode, full_param, data, torch.arange(12), scale)
    full.backward()

    split_param = base.clone().requires_grad_(True)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(1))  # ranks get any rows
    total, start = 0.0, 0
    for rank in layout:
        for size in rank:
            rows = perm[start : start + size]
            start += size
            partial = objective(kind, mode, split_param, data, rows, scale)
            partial.backward()  # gradients accumulate like the engine's
            total += partial.item()
    assert start == 12
    assert total == pytest.approx(full.item(), rel=1e-12, abs=1e-12)
    assert torch.allclose(split_param.grad, full_param.grad, rtol=1e-12, atol=1e-12)
    assert full_param.grad.abs().sum() > 0


def test_local_means_would_not_be_invariant():
    """Sanity check of the test above: averaging per-micro-batch token means is wrong."""
    data, offset = make_batch()
    mask = data["response_mask"]
    loss_mat = offset.abs()
    full = agg_loss(loss_mat, mask, "token-mean", LossScale.whole_batch(mask)).item()
    parts = [slice(0, 2), slice(2, 12)]
    local = [
        agg_loss(loss_mat[p], mask[p], "token-mean", LossScale.whole_batch(mask[p])).item()
        for p in parts
    ]
    assert sum(local) / 2 != pytest.approx(full, rel=1e-3)

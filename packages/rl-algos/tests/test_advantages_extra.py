"""OPO, GPG and GRPO pass@k estimators, and REINFORCE++ across mid-response masked tokens:
hand-worked numbers, float64 plain-Python re-derivations and invariants."""

from __future__ import annotations

import math
import random
from collections import defaultdict

import numpy as np
import pytest
import torch

from rl_algos.advantages import ADVANTAGE_ESTIMATORS


def outcome(scores, lengths, width=5):
    """[B, R] rewards with each score on the last valid token, and the response mask."""
    rewards = torch.zeros(len(scores), width, dtype=torch.float64)
    mask = torch.zeros(len(scores), width, dtype=torch.float64)
    for i, (score, length) in enumerate(zip(scores, lengths)):
        mask[i, :length] = 1
        rewards[i, length - 1] = score
    return rewards, mask


def run(name, rewards, mask, index, **knobs):
    fn = ADVANTAGE_ESTIMATORS.get(name)
    return fn(
        token_level_rewards=rewards,
        response_mask=mask,
        index=np.array(index, dtype=object),
        **knobs,
    )


def test_new_estimators_resolve_by_name():
    assert {"opo", "gpg", "grpo_passk"} <= set(ADVANTAGE_ESTIMATORS.names())


# ----------------------------------------------------------------------------- OPO


def test_opo_by_hand_length_weighted_baseline():
    # group a: scores 1, 0, 1 with lengths 2, 4, 2 -> b = (2*1 + 4*0 + 2*1) / 8 = 0.5
    # group b: one sample -> baseline 0; group c: all equal -> 0
    rewards, mask = outcome([1, 0, 1, 3, 2, 2], [2, 4, 2, 3, 1, 5])
    adv, ret = run("opo", rewards, mask, ["a", "a", "a", "b", "c", "c"])
    per_sample = [0.5, -0.5, 0.5, 3.0, 0.0, 0.0]
    for i, value in enumerate(per_sample):
        assert adv[i][mask[i] == 1].tolist() == pytest.approx([value] * int(mask[i].sum()))
    assert (adv[mask == 0] == 0).all()
    assert torch.equal(adv, ret)


def test_opo_length_weighted_sums_vanish_in_each_group():
    gen = torch.Generator().manual_seed(3)
    lengths = torch.randint(1, 9, (12,), generator=gen).tolist()
    scores = torch.randn(12, generator=gen, dtype=torch.float64).tolist()
    rewards, mask = outcome(scores, lengths, width=8)
    index = [i // 4 for i in range(12)]
    adv, _ = run("opo", rewards, mask, index)
    # sum over the group's tokens of A is sum_i |o_i| (R_i - b) = 0 by the choice of b
    for g in range(3):
        assert adv[4 * g : 4 * g + 4].sum().item() == pytest.approx(0.0, abs=1e-12)


# ----------------------------------------------------------------------------- GPG


def test_gpg_by_hand():
    # B = 4 samples, 3 with a non-zero score -> alpha = 4 / 3
    # group a: scores 1, 0 -> mean 0.5 -> A = 4/3 * (+-0.5); group b: 1, 1 -> A = 0
    rewards, mask = outcome([1, 0, 1, 1], [2, 3, 1, 4])
    adv, _ = run("gpg", rewards, mask, ["a", "a", "b", "b"])
    expected = [2 / 3, -2 / 3, 0.0, 0.0]
    for i, value in enumerate(expected):
        assert adv[i][mask[i] == 1].tolist() == pytest.approx([value] * int(mask[i].sum()))
    assert (adv[mask == 0] == 0).all()


def test_gpg_advantages_sum_to_zero_in_each_group():
    gen = torch.Generator().manual_seed(4)
    scores = torch.randint(0, 3, (12,), generator=gen).double().tolist()  # some exactly 0
    rewards, mask = outcome(scores, [3] * 12, width=3)
    adv, _ = run("gpg", rewards, mask, [i // 4 for i in range(12)])
    for g in range(3):
        assert adv[4 * g : 4 * g + 4, 0].sum().item() == pytest.approx(0.0, abs=1e-12)
    assert adv.abs().sum() > 0


def test_gpg_all_zero_scores_give_zero_not_nan():
    rewards, mask = outcome([0, 0, 0, 0], [1, 2, 3, 4])
    adv, _ = run("gpg", rewards, mask, ["a", "a", "b", "b"])
    assert torch.equal(adv, torch.zeros_like(adv))


# ----------------------------------------------------------------------------- pass@k


def test_grpo_passk_by_hand():
    # group a: 0, 1, 0.5 -> only the best learns: (1 - 0.5) / (std + eps), std = 0.5
    # group b: a tie at the top -> R_max - R_second = 0 for everyone
    rewards, mask = outcome([0.0, 1.0, 0.5, 1.0, 1.0, 0.0], [2, 3, 1, 4, 2, 2])
    index = ["a", "a", "a", "b", "b", "b"]
    adv, _ = run("grpo_passk", rewards, mask, index, epsilon=1e-6)
    sample = adv.sum(-1) / mask.sum(-1)
    assert sample.tolist() == pytest.approx([0, 0.5 / (0.5 + 1e-6), 0, 0, 0, 0])
    plain, _ = run("grpo_passk", rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert (plain.sum(-1) / mask.sum(-1)).tolist() == pytest.approx([0, 0.5, 0, 0, 0, 0])
    assert (adv[mask == 0] == 0).all()


def test_grpo_passk_needs_two_samples_per_group():
    rewards, mask = outcome([1.0, 0.0, 1.0], [1, 1, 1])
    with pytest.raises(ValueError, match=r"grpo_passk.*>= 2 samples.*'lonely'"):
        run("grpo_passk", rewards, mask, ["g", "g", "lonely"])


# ----------------------------------------------------------------------------- references


def reference(name, scores, lengths, index, eps=1e-6):
    """Plain-Python float64 re-derivation of the per-sample advantages from the papers."""
    groups = defaultdict(list)
    for i, g in enumerate(index):
        groups[g].append(i)
    out = [0.0] * len(scores)
    nonzero = max(sum(1 for s in scores if s != 0), 1)
    for rows in groups.values():
        vals = [scores[i] for i in rows]
        n = len(rows)
        mean = sum(vals) / n
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else 1.0
        if name == "opo":
            b = sum(lengths[i] * scores[i] for i in rows) / sum(lengths[i] for i in rows)
            for i in rows:
                out[i] = scores[i] - (b if n > 1 else 0.0)
        elif name == "gpg":
            for i in rows:
                out[i] = len(scores) / nonzero * (scores[i] - (mean if n > 1 else 0.0))
        else:  # grpo_passk
            ranked = sorted(rows, key=lambda i: -scores[i])
            best, second = ranked[0], ranked[1]
            out[best] = (scores[best] - scores[second]) / (std + eps)
    return out


@pytest.mark.parametrize("name", ["opo", "gpg", "grpo_passk"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_a_float64_re_derivation(name, seed):
    rng = random.Random(seed)
    size = 15
    # distinct scores (no ties, so the pass@k winner is unique), some exactly 0
    scores = [rng.choice([0.0, rng.uniform(-2, 2)]) + 1e-3 * i for i in range(size)]
    scores[4] = 0.0
    lengths = [rng.randint(1, 7) for _ in range(size)]
    index = [rng.choice("xyz") for _ in range(size)]
    for g in "xyz":  # every group has >= 2 samples
        index += [g, g]
        scores += [rng.uniform(-1, 1), rng.uniform(-1, 1)]
        lengths += [rng.randint(1, 7), rng.randint(1, 7)]
    rewards, mask = outcome(scores, lengths, width=7)
    adv, _ = run(name, rewards, mask, index)
    expected = reference(name, scores, lengths, index)
    for i in range(len(scores)):
        assert adv[i][mask[i] == 1].tolist() == pytest.approx(
            [expected[i]] * lengths[i], rel=1e-9, abs=1e-12
        )
        assert (adv[i][mask[i] == 0] == 0).all()


@pytest.mark.parametrize("name", ["opo", "gpg", "grpo_passk"])
def test_all_equal_groups_get_zero_advantage(name):
    rewards, mask = outcome([0.7, 0.7, 0.7, -1.0, -1.0], [1, 2, 3, 4, 5])
    adv, _ = run(name, rewards, mask, ["a", "a", "a", "b", "b"])
    assert adv.abs().max().item() < 1e-12  # 0 up to the rounding of the mean


# ----------------------------------------------------------------------------- REINFORCE++


def test_reinforce_plus_plus_carries_the_return_across_a_tool_output():
    # [model, tool, tool, model, model], reward 1 on the last token, gamma 0.5:
    # G4 = 1, G3 = 0.5 * 1 = 0.5, the tool tokens are not steps, G0 = 0.5 * G3 = 0.25
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 0, 1, 1]], dtype=torch.float64)
    adv, ret = ADVANTAGE_ESTIMATORS.get("reinforce_plus_plus")(
        token_level_rewards=rewards, response_mask=mask, gamma=0.5
    )
    assert ret[0].tolist() == pytest.approx([0.25, 0.0, 0.0, 0.5, 1.0])
    valid = torch.tensor([0.25, 0.5, 1.0], dtype=torch.float64)
    expected = (valid - valid.mean()) / torch.sqrt(valid.var(unbiased=True) + 1e-8)
    assert adv[mask == 1].tolist() == pytest.approx(expected.tolist())
    assert adv[0, 1] == 0 and adv[0, 2] == 0


def test_reinforce_plus_plus_with_tool_outputs_equals_the_compacted_response():
    """Removing the masked columns (the tool outputs) from each row must not change the
    returns of the model's tokens (verl #7278); trailing padding still starts at 0."""
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(4, 9, generator=gen, dtype=torch.float64)
    mask = torch.tensor(
        [
            [1, 1, 0, 0, 1, 1, 1, 0, 0],
            [1, 0, 1, 0, 1, 0, 1, 1, 1],
            [1, 1, 1, 1, 1, 1, 1, 1, 1],
            [0, 1, 1, 0, 0, 0, 1, 0, 0],
        ],
        dtype=torch.float64,
    )
    _, ret = ADVANTAGE_ESTIMATORS.get("reinforce_plus_plus")(
        token_level_rewards=rewards, response_mask=mask, gamma=0.9
    )
    for i in range(4):
        kept = rewards[i][mask[i] == 1].tolist()
        running, expected = 0.0, []
        for r in reversed(kept):  # a plain discounted return over the model's tokens only
            running = r + 0.9 * running
            expected.append(running)
        assert ret[i][mask[i] == 1].tolist() == pytest.approx(expected[::-1], rel=1e-12)
        assert (ret[i][mask[i] == 0] == 0).all()


def test_opo_lengths_count_only_the_models_tokens():
    # row 0 has a 2-token tool output inside its response: its length is 2, not 4
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 0, 1], [1, 1, 1, 1]], dtype=torch.float64)
    adv, _ = run("opo", rewards, mask, ["g", "g"])
    b = (2 * 1.0 + 4 * 0.0) / 6  # length-weighted with lengths 2 and 4
    assert adv[0].tolist() == pytest.approx([1 - b, 0.0, 0.0, 1 - b])
    assert adv[1].tolist() == pytest.approx([-b] * 4)

"""DAPO: dynamic sampling across generation rounds and overlong shaping."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_algos.dapo import DynamicSampler, groups_with_variance, overlong_penalty
from rl_core import DataProto


def round_batch(groups, round_id):
    """A scored batch: groups = list of per-sample scores (one list per prompt)."""
    uids, scores, acc = [], [], []
    for g, values in enumerate(groups):
        for v in values:
            uids.append(f"r{round_id}-g{g}")
            scores.append(v)
            acc.append(float(v > 0))
    token_scores = torch.zeros(len(scores), 3)
    token_scores[:, -1] = torch.tensor(scores)
    return DataProto.from_dict(
        tensors={"token_level_scores": token_scores, "row": torch.arange(len(scores))},
        non_tensors={"uid": uids, "acc": acc},
        meta_info={"round": round_id},
    )


def test_groups_with_variance():
    values = np.array([1, 1, 0, 1, 2, 2, 5.0])
    index = np.array(["a", "a", "b", "b", "c", "c", "d"], dtype=object)
    assert groups_with_variance(values, index).tolist() == [
        False,
        False,
        True,
        True,
        False,
        False,
        True,
    ]


def test_accumulates_informative_groups_until_full():
    sampler = DynamicSampler(num_groups=3, metric="seq_score", max_rounds=5)
    # round 0: one informative group of three
    assert not sampler.add(round_batch([[1, 1], [0, 1], [0, 0]], 0))
    assert sampler.num_kept_groups == 1
    # round 1: two informative groups -> 3 kept: full
    assert sampler.add(round_batch([[1, 0], [2, 2], [0, 3]], 1))
    # round 2 would be more than needed; take() truncates to exactly 3 groups
    batch, metrics = sampler.take()
    assert list(dict.fromkeys(batch.non_tensor_batch["uid"])) == ["r0-g1", "r1-g0", "r1-g2"]
    assert len(batch) == 6
    assert batch.batch["token_level_scores"][:, -1].tolist() == [0, 1, 1, 0, 0, 3]
    assert metrics == {
        "dapo/gen_rounds": 2.0,
        "dapo/groups_seen": 6.0,
        "dapo/groups_kept": 3.0,
        "dapo/kept_fraction": 0.5,
        "dapo/partial_batch": 0.0,
    }
    assert batch.meta_info == {"round": 0}
    assert sampler.rounds == 0 and sampler.num_kept_groups == 0  # reset for the next step


def test_truncates_surplus_groups_and_uses_a_non_tensor_metric():
    sampler = DynamicSampler(num_groups=1, metric="acc")
    assert sampler.add(round_batch([[3, 1], [0, 2]], 0))  # acc: [1, 1] constant, [0, 1] varies
    batch, metrics = sampler.take()
    assert batch.non_tensor_batch["uid"].tolist() == ["r0-g1", "r0-g1"]
    assert metrics["dapo/groups_kept"] == 1.0


def test_round_cap_raises_or_returns_a_partial_batch():
    strict = DynamicSampler(num_groups=4, max_rounds=2)
    assert not strict.add(round_batch([[1, 0], [1, 1]], 0))
    with pytest.raises(RuntimeError, match=r"kept 1/4 groups .* after 2 generation rounds"):
        strict.add(round_batch([[1, 1]], 1))
    lenient = DynamicSampler(num_groups=4, max_rounds=2, accept_partial=True)
    lenient.add(round_batch([[1, 0], [1, 1]], 0))
    assert lenient.add(round_batch([[0, 0]], 1))
    batch, metrics = lenient.take()
    assert len(batch) == 2 and metrics["dapo/partial_batch"] == 1.0
    with pytest.raises(KeyError, match="neither seq_score, seq_reward nor a non-tensor field"):
        DynamicSampler(num_groups=1, metric="accuracy").add(round_batch([[1, 0]], 0))


def test_overlong_penalty_by_hand():
    lengths = torch.tensor([0, 12, 16, 18, 20])
    # max 20, buffer 8: free up to 12, then -(len - 12) / 8 * 0.5
    expected = [0.0, 0.0, -0.25, -0.375, -0.5]
    assert overlong_penalty(lengths, 20, 8, 0.5).tolist() == pytest.approx(expected)
    with pytest.raises(ValueError, match="overlong buffer length"):
        overlong_penalty(lengths, 20, 0, 1.0)

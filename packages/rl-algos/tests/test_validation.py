"""Validation metrics: pass@k, maj@k, mean@n, per data source (hand-computed references),
and validation scores without training-only shaping."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
import torch

from rl_algos.validation import majority_at_k, pass_at_k, report_ks, validation_metrics


def _pass_at_k_by_enumeration(correct: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(correct, k))
    return float(Fraction(sum(any(s) for s in subsets), len(subsets)))


@pytest.mark.parametrize("n,c,k", [(4, 1, 2), (4, 0, 1), (5, 2, 3), (8, 3, 4), (6, 6, 6)])
def test_pass_at_k_is_the_fraction_of_k_subsets_with_a_correct_sample(n, c, k):
    correct = [True] * c + [False] * (n - c)
    assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_by_enumeration(correct, k), abs=1e-12)


def test_pass_at_k_hand_values_and_errors():
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 3, 2) == 1.0
    with pytest.raises(ValueError, match="k=5"):
        pass_at_k(4, 1, 5)


def test_majority_at_k_by_hand():
    # answers a, a, b, c; b is right
    preds, correct = ["a", "a", "b", "c"], [False, False, True, False]
    assert majority_at_k(preds, correct, 4) == 0.0  # a wins 2:1:1
    assert majority_at_k(preds, correct, 1) == pytest.approx(0.25)
    # k=2: aa 0, ab 1/2, ac 0, ab 1/2, ac 0, bc 1/2 -> 1.5 / 6
    assert majority_at_k(preds, correct, 2) == pytest.approx(0.25)
    # no answer does not vote: (None, None, b) -> b wins
    assert majority_at_k([None, None, "b"], [False, False, True], 3) == 1.0
    assert majority_at_k([None, None], [False, False], 2) == 0.0


def test_report_ks():
    assert report_ks(1) == [1]
    assert report_ks(4) == [1, 2, 4]
    assert report_ks(6) == [1, 2, 4, 6]


def test_validation_metrics_overall_and_per_data_source():
    # prompt p0 (math): 1 of 4 right; p1 (math): 4 of 4; p2 (code): 0 of 4
    gids = [g for g in ("p0", "p1", "p2") for _ in range(4)]
    sources = ["math"] * 8 + ["code"] * 4
    correct = [True, False, False, False] + [True] * 4 + [False] * 4
    scores = [1.0 if c else 0.25 for c in correct]
    preds = ["7", "3", "3", None] + ["9"] * 4 + ["x", "y", "x", "y"]
    m = validation_metrics(gids, scores, correct, sources, preds)
    assert m["val/accuracy"] == pytest.approx(5 / 12)
    assert m["val/mean@4"] == m["val/accuracy"]
    assert m["val/score"] == pytest.approx((5 * 1.0 + 7 * 0.25) / 12)
    assert m["val/pass@1"] == pytest.approx((0.25 + 1 + 0) / 3)
    assert m["val/pass@2"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert m["val/pass@4"] == pytest.approx((1 + 1 + 0) / 3)
    assert m["val/maj@4"] == pytest.approx((0 + 1 + 0) / 3)  # p0: "3" beats "7"
    assert m["val/math/accuracy"] == pytest.approx(5 / 8)
    assert m["val/math/pass@4"] == 1.0
    assert m["val/code/accuracy"] == 0.0 and m["val/code/maj@1"] == 0.0
    # without answers there is no maj@k
    assert not any("maj@" in k for k in validation_metrics(gids, scores, correct, sources))
    with pytest.raises(ValueError, match="different sample counts"):
        validation_metrics(gids[:-1], scores[:-1], correct[:-1], sources[:-1])


def test_validation_scores_leave_out_the_overlong_penalty(tmp_path):
    from transformers import AutoTokenizer

    from rl_algos.rewards import OverlongBuffer, RewardManager
    from rl_algos.trainer.model_source import resolve_model_path
    from rl_core.protocol import DataProto

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny-random:qwen2"))
    prompt = tokenizer("1+1=", return_tensors="pt").input_ids
    response = tokenizer("\\boxed{2}", return_tensors="pt").input_ids  # 9 tokens, full length
    batch = DataProto.from_dict(
        {
            "prompts": prompt,
            "responses": response,
            "attention_mask": torch.ones(1, prompt.shape[1] + response.shape[1], dtype=torch.long),
        },
        non_tensors={
            "data_source": np.array(["arithmetic"], dtype=object),
            "reward_model": np.array([{"ground_truth": "2"}], dtype=object),
        },
    )
    buffer = OverlongBuffer(length=4, penalty_factor=1.0, max_response_length=response.shape[1])
    manager = RewardManager(tokenizer, num_workers=0, overlong=buffer)
    try:
        shaped = manager(batch).token_level_scores.sum()
        raw = manager(batch, shaping=False).token_level_scores.sum()
    finally:
        manager.close()
    assert raw == 1.0  # correct answer
    assert shaped == pytest.approx(0.0)  # at max length: the full penalty of -1


def test_accuracy_interval_is_the_95_percent_half_width():
    from rl_algos.validation import accuracy_interval

    # 100 problems, 40 right, one greedy sample each: 1.96 * sqrt(var/100) with the sample
    # variance 0.4 * 0.6 * 100/99, which is wider than Wilson's half-width here
    ids, correct = list(range(100)), [True] * 40 + [False] * 60
    expected = 1.96 * (0.24 * 100 / 99 / 100) ** 0.5
    assert accuracy_interval(ids, correct) == pytest.approx(expected)
    assert accuracy_interval(ids, correct) == pytest.approx(0.0965, abs=1e-4)
    # all right: the standard error is 0, Wilson's half-width is not
    z, count = 1.96, 20
    wilson = z * (z * z / (4 * count * count)) ** 0.5 / (1 + z * z / count)
    assert accuracy_interval(list(range(count)), [True] * count) == pytest.approx(wilson)
    # 4 samples per problem: the interval is over the problems' means (2 problems: 1, 0.5)
    two = accuracy_interval([0] * 4 + [1] * 4, [True] * 4 + [True, False] * 2)
    assert two == pytest.approx(1.96 * (0.125 / 2) ** 0.5)  # 0.49 > Wilson's 0.39
    with pytest.raises(ValueError, match="accuracy_interval: 2 ids, 1 flags"):
        accuracy_interval([0, 1], [True])


def test_kind_metrics_are_each_kinds_means_and_their_mean():
    from rl_algos.validation import kind_metrics

    kinds = ["gcd", "gcd", "gcd", "sum", "sum"]
    correct = [True, False, False, True, True]
    extras = {
        "strict": [1.0, 0.0, 1, 0.0, 1.0],  # ints count as numbers
        "acc": [1.0] * 5,  # accuracy comes from `correct`, not from the extra
        "pred": ["1", "2", "3", "4", "5"],  # not numbers: left out
        "label": [0.5, None, 0.5, 0.5, 0.5],  # one sample without a number: left out
    }
    assert kind_metrics(kinds, correct, extras) == pytest.approx(
        {
            "val/kind/gcd/accuracy": 1 / 3,
            "val/kind/sum/accuracy": 1.0,
            "val/kind_mean/accuracy": (1 / 3 + 1.0) / 2,  # a mean over kinds, not samples
            "val/kind/gcd/strict": 2 / 3,
            "val/kind/sum/strict": 0.5,
            "val/kind_mean/strict": (2 / 3 + 0.5) / 2,
        }
    )

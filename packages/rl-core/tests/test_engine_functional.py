"""Per-token log-prob/entropy math against float64 references and hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from rl_core.engine import (
    entropy_from_logits,
    partition_by_count,
    partition_by_token_budget,
    token_log_probs,
    token_log_probs_and_entropy,
)


def reference(logits: torch.Tensor, labels: torch.Tensor, temperature: float):
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    picked = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked, -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_log_probs_and_entropy_match_float64(temperature, dtype):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 97, generator=g) * 4).to(dtype)
    labels = torch.randint(0, 97, (3, 5), generator=g)
    logp, ent = token_log_probs_and_entropy(logits, labels, temperature)
    want_logp, want_ent = reference(logits, labels, temperature)
    assert logp.dtype == ent.dtype == torch.float32
    torch.testing.assert_close(logp.double(), want_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent.double(), want_ent, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(token_log_probs(logits, labels, temperature), logp)
    torch.testing.assert_close(entropy_from_logits(logits, temperature), ent)


def test_hand_computed_values():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # probabilities 1/4, 3/4
    logp, ent = token_log_probs_and_entropy(logits, torch.tensor([1]))
    assert logp.item() == pytest.approx(math.log(0.75))
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    # temperature 2 halves the logits: probabilities 1/(1+sqrt 3), sqrt 3/(1+sqrt 3)
    p1 = math.sqrt(3) / (1 + math.sqrt(3))
    assert token_log_probs(logits, torch.tensor([1]), 2.0).item() == pytest.approx(math.log(p1))


def test_extreme_logits_stay_finite():
    logits = torch.tensor([[1e4, -1e4, 0.0]])
    logp, ent = token_log_probs_and_entropy(logits, torch.tensor([1]))
    assert logp.item() == pytest.approx(-2e4) and ent.item() == pytest.approx(0.0, abs=1e-6)


def test_gradients_flow_to_logits():
    logits = torch.randn(4, 11, requires_grad=True)
    labels = torch.randint(0, 11, (4,))
    token_log_probs(logits, labels).sum().backward()
    # d log softmax(z)[y] / dz = onehot(y) - softmax(z)
    want = torch.nn.functional.one_hot(labels, 11) - torch.softmax(logits.detach(), -1)
    torch.testing.assert_close(logits.grad, want)


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_temperature(temperature):
    with pytest.raises(ValueError, match="temperature"):
        token_log_probs(torch.zeros(1, 3), torch.tensor([0]), temperature)


def test_partition_by_count():
    assert partition_by_count(5, 2) == [[0, 1, 2], [3, 4]]
    assert partition_by_count(3, 3) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="cannot split 2 sequences into 3"):
        partition_by_count(2, 3)


def test_partition_by_token_budget_first_fit_decreasing():
    # sorted: 7(0) 6(3) 4(1) 3(2) 2(4) -> bins [7,3] [6,4] [2]
    assert partition_by_token_budget([7, 4, 3, 6, 2], 10) == [[0, 2], [1, 3], [4]]
    # asking for more parts splits the fullest bin
    parts = partition_by_token_budget([7, 4, 3, 6, 2], 10, min_parts=4)
    assert len(parts) == 4 and sorted(i for p in parts for i in p) == [0, 1, 2, 3, 4]

"""Per-row sampling of the hf backend against independent references."""

import math

import pytest
import torch

from rl_rollout.backends.sampling import RowSampling, sample_rows


def rows(n, temperature=1.0, top_p=1.0, top_k=-1, generators=None):
    return RowSampling(
        temperature=torch.full((n,), float(temperature)),
        top_p=torch.full((n,), float(top_p)),
        top_k=torch.full((n,), top_k, dtype=torch.long),
        generators=generators or [None] * n,
    )


def test_greedy_rows_take_the_argmax_and_report_unscaled_log_probs():
    logits = torch.tensor([[0.1, 2.0, -1.0, 0.5], [3.0, 0.0, 0.0, 2.9]])
    tokens, log_probs = sample_rows(logits, rows(2, temperature=0.0, top_k=2), None)
    assert tokens.tolist() == [1, 0]
    expected = [logits[0].log_softmax(-1)[1].item(), logits[1].log_softmax(-1)[0].item()]
    assert log_probs.tolist() == pytest.approx(expected, abs=1e-6)


def test_empirical_distribution_matches_temperature_softmax():
    logits = torch.tensor([1.0, 0.0, -1.0, 0.5])
    n = 20000
    params = rows(n, temperature=0.7)
    gen = torch.Generator().manual_seed(0)
    tokens, log_probs = sample_rows(logits.expand(n, 4), params, gen)
    expected = (logits / 0.7).softmax(-1)
    freq = torch.bincount(tokens, minlength=4).double() / n
    # 4-sigma binomial bound per token
    bound = 4 * torch.sqrt(expected * (1 - expected) / n)
    assert bool(((freq - expected).abs() <= bound).all()), (freq, expected)
    assert torch.allclose(log_probs, (logits / 0.7).log_softmax(-1)[tokens], atol=1e-6)


def reference_truncated(logits, top_k, top_p):
    """Independent reference: keep top-k, renormalise, keep the top-p nucleus, renormalise."""
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    kept = order[: top_k if top_k > 0 else len(order)]
    z = sum(math.exp(logits[i]) for i in kept)
    nucleus, mass = [], 0.0
    for i in kept:
        if mass >= top_p:
            break
        nucleus.append(i)
        mass += math.exp(logits[i]) / z
    z2 = sum(math.exp(logits[i]) for i in nucleus)
    return {i: logits[i] - math.log(z2) for i in nucleus}


@pytest.mark.parametrize(("top_k", "top_p"), [(3, 1.0), (-1, 0.6), (4, 0.7), (1, 1.0)])
def test_truncation_keeps_the_right_set_and_renormalises(top_k, top_p):
    logits = torch.tensor([2.0, 1.5, 1.0, 0.2, -0.3, -1.0])
    ref = reference_truncated(logits.tolist(), top_k, top_p)
    n = 4000
    tokens, log_probs = sample_rows(
        logits.expand(n, 6), rows(n, top_k=top_k, top_p=top_p), torch.Generator().manual_seed(1)
    )
    assert set(tokens.tolist()) == set(ref)  # every kept token shows up, no other does
    for token, lp in zip(tokens.tolist(), log_probs.tolist()):
        assert lp == pytest.approx(ref[token], abs=1e-5)


def test_seeded_rows_do_not_depend_on_the_rest_of_the_batch():
    torch.manual_seed(0)
    logits = torch.randn(5, 50)
    make = lambda: torch.Generator().manual_seed(42)  # noqa: E731
    alone, _ = sample_rows(logits[2:3], rows(1, generators=[make()]), None)
    params = rows(5, generators=[None, None, make(), None, None])
    together, _ = sample_rows(logits, params, torch.Generator().manual_seed(9))
    assert together[2].item() == alone[0].item()


def test_select_keeps_rows_in_order():
    gens = [torch.Generator(), None, torch.Generator()]
    params = RowSampling(
        torch.tensor([0.5, 1.0, 1.5]), torch.tensor([1.0, 0.9, 0.8]), torch.tensor([-1, 5, 7]), gens
    )
    picked = params.select(torch.tensor([0, 2]))
    assert picked.temperature.tolist() == [0.5, 1.5]
    assert picked.top_k.tolist() == [-1, 7]
    assert picked.generators[0] is gens[0] and picked.generators[1] is gens[2]

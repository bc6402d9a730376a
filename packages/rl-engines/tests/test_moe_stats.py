"""MoE router statistics and load-balancing loss (`rl_engines.moe`) against hand
computations, and the Hugging Face router probe: padding takes no part."""

from __future__ import annotations

import math

import megatron_models
import pytest
import torch

from rl_core.testing.train_engine import make_rl_batch
from rl_engines.moe import HFRouterProbe, RouterStats, load_balancing_loss, summarize

NEG = -1e9  # exp() underflows to 0 in float64: those experts get probability 0


def _map(*rows):
    return torch.tensor(rows, dtype=torch.bool)


def test_router_statistics_match_a_hand_computation_and_skip_padding():
    stats = RouterStats(num_layers=2, num_experts=4)
    stats.enabled = True
    # layer 1: three real tokens with a uniform router (entropy ln 4 each), sent to experts
    # {0,1}, {0,2}, {0,3}: counts [3,1,1,1], max/mean = 3 / 1.5 = 2. The padding token
    # (a confident router, experts {2,3}) must not count.
    logits1 = torch.tensor([[0.0] * 4, [0.0] * 4, [100.0, 0, 0, 0], [0.0] * 4])
    map1 = _map([1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 1, 1], [1, 0, 0, 1])
    valid1 = torch.tensor([True, True, False, True])
    stats.record(1, logits1, map1, valid1)
    # layer 2: two equally likely experts (entropy ln 2), counts [2,2,1,1]: max/mean 4/3
    logits2 = torch.tensor([[0.0, 0.0, NEG, NEG]] * 3, dtype=torch.float64)
    map2 = _map([1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1])
    stats.record(2, logits2, map2, torch.ones(3, dtype=torch.bool))
    metrics = stats.metrics(True, torch.device("cpu"))
    assert metrics["moe/expert_load_max_over_mean"] == pytest.approx((2.0 + 4.0 / 3.0) / 2)
    # (3 ln 4 + 3 ln 2) / 6 real (token, layer) pairs
    assert metrics["moe/router_entropy"] == pytest.approx(1.5 * math.log(2))
    assert float(stats.table.abs().sum()) == 0.0  # cleared for the next step
    # a second micro-batch of the same step adds up before the ratio is taken
    stats.record(1, logits1, map1, valid1)
    stats.record(1, torch.zeros(1, 4), _map([0, 1, 1, 0]), torch.ones(1, dtype=torch.bool))
    again = stats.metrics(True, torch.device("cpu"))  # counts [3,2,2,1]: 3 / 2
    assert again["moe/expert_load_max_over_mean"] == pytest.approx(1.5)
    assert again["moe/router_entropy"] == pytest.approx(math.log(4))


def test_router_statistics_record_only_inside_a_step_and_not_in_recompute():
    stats = RouterStats(num_layers=1, num_experts=2)
    logits, routing = torch.zeros(2, 2), _map([1, 0], [0, 1])
    stats.record(1, logits, routing, torch.ones(2, dtype=torch.bool))  # not enabled
    assert stats.metrics(True, torch.device("cpu")) == {}
    stats.enabled = True
    with pytest.raises(ValueError, match=r"layer 2 outside 1\.\.1"):
        stats.record(2, logits, routing, torch.ones(2, dtype=torch.bool))
    assert summarize(torch.zeros(1, 4)) == {}


def test_load_balancing_loss_matches_the_switch_formula_on_real_tokens():
    torch.manual_seed(0)
    logits = torch.randn(6, 4, dtype=torch.float64)
    valid = torch.tensor([True, True, False, True, True, False])
    got = load_balancing_loss(logits, topk=2, valid=valid)
    # float64 re-derivation: E / (k T^2) * sum_e P_e N_e over the 4 real tokens
    real = logits[valid]
    probs = torch.softmax(real, -1)
    counts = [0.0] * 4
    for row in probs:
        for e in torch.topk(row, 2).indices.tolist():
            counts[e] += 1
    want = sum(float(probs[:, e].sum()) * counts[e] for e in range(4)) * 4 / (2 * 4 * 4)
    assert float(got) == pytest.approx(want, rel=1e-6)
    # perfectly balanced and uniform routing gives exactly 1
    uniform = load_balancing_loss(torch.zeros(4, 4), 2, torch.ones(4, dtype=torch.bool))
    assert float(uniform) == pytest.approx(1.0)
    assert float(load_balancing_loss(logits, 2, torch.zeros(6, dtype=torch.bool))) == 0.0


@pytest.mark.megatron
def test_load_balancing_loss_equals_megatron_cores_with_padding_mask():
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.moe.moe_utils import (
        compute_routing_scores_for_aux_loss,
        switch_load_balancing_loss_func,
    )

    torch.manual_seed(1)
    logits = torch.randn(10, 4)
    padding = torch.tensor([False] * 7 + [True] * 3)  # megatron-core: True at padding
    routing_map, scores = compute_routing_scores_for_aux_loss(logits, 2, "softmax", False, padding)
    counts = routing_map.sum(0)
    want = switch_load_balancing_loss_func(scores, counts, int(counts.sum()) // 2, 2, 4, 1.0)
    got = load_balancing_loss(logits, 2, ~padding)
    assert float(got) == pytest.approx(float(want), rel=1e-6)


def _probe_run(model, probe, input_ids, attention_mask, position_ids):
    with probe.forward(attention_mask) as aux:
        model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    return float(aux[0].detach()), probe.stats.metrics(True, torch.device("cpu"))


def test_hf_router_probe_ignores_padding(tmp_path):
    from transformers import AutoModelForCausalLM

    model_dir = megatron_models.save_tiny_moe(str(tmp_path / "moe"))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    probe = HFRouterProbe.install(model)
    assert probe is not None and probe.stats.num_layers == 2 and probe.topk == 2
    batch = make_rl_batch(num_seqs=4).batch
    ids, mask, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    padded_aux, padded = _probe_run(model, probe, ids, mask, pos)
    # the same real tokens with no padding at all: each sequence alone, and packed
    router_logits: list[list[torch.Tensor]] = [[], []]
    for i in range(len(ids)):
        keep = mask[i].bool()
        out = model(
            input_ids=ids[i, keep][None],
            position_ids=pos[i, keep][None],
            output_router_logits=True,
        )
        for layer in range(2):
            router_logits[layer].append(out.router_logits[layer].reshape(-1, 4))
    stats = RouterStats(2, 4)
    stats.enabled = True
    want_aux = 0.0
    for layer in range(2):
        logits = torch.cat(router_logits[layer])
        chosen = torch.topk(logits, 2, -1).indices
        routing = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, chosen, True)
        stats.record(layer + 1, logits, routing, torch.ones(len(logits), dtype=torch.bool))
        want_aux += float(load_balancing_loss(logits, 2, torch.ones(len(logits), dtype=torch.bool)))
    want = stats.metrics(True, torch.device("cpu"))
    assert padded_aux == pytest.approx(want_aux, rel=1e-9)
    for key in ("moe/expert_load_max_over_mean", "moe/router_entropy"):
        assert padded[key] == pytest.approx(want[key], rel=1e-9), key
    # outside `forward` (inference) nothing is recorded
    model(input_ids=ids, attention_mask=mask)
    assert float(probe.stats.table.abs().sum()) == 0.0


def test_hf_router_probe_is_none_for_dense_models(tmp_path):
    from transformers import AutoModelForCausalLM

    from rl_core.testing.train_engine import save_tiny_model

    model = AutoModelForCausalLM.from_pretrained(save_tiny_model(str(tmp_path / "d"), "qwen2"))
    assert HFRouterProbe.install(model) is None

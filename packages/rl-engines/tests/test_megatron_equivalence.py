"""Megatron TP=2, PP=2 (with virtual stages) and EP=2 against the FSDP2 engine and a
float64 Hugging Face forward on the same weights: log-probs and entropy before, and after
one AdamW step on the same batch the loss, gradient norm, updated weights and log-probs."""

from __future__ import annotations

import megatron_cases
import megatron_models
import pytest
import torch

from rl_core.testing.spawn import SpawnRunner
from rl_core.testing.train_engine import make_rl_batch, reference_outputs

pytestmark = [pytest.mark.megatron, pytest.mark.slow]

LAYOUTS = {
    "tp2": ("qwen2", {"parallel": {"tensor_parallel_size": 2}}),
    "tp2-sp": (
        "llama",
        {"parallel": {"tensor_parallel_size": 2}, "engine_kwargs": {"sequence_parallel": True}},
    ),
    "pp2": ("qwen2", {"parallel": {"pipeline_parallel_size": 2}}),
    "pp2-vpp2": (
        "llama",
        {
            "parallel": {"pipeline_parallel_size": 2},
            "engine_kwargs": {"virtual_pipeline_size": 2},
            "model": {"override_config": {"num_hidden_layers": 4}},
        },
    ),
    "ep2": ("qwen3_moe", {"parallel": {"expert_parallel_size": 2}}),
    # the load-balancing loss in the gradient: each of the 2 EP (= DP) ranks averages its
    # 4 sequences' loss, as FSDP2 does over 2 micro-batches of 4; padding takes no part
    "ep2-aux": (
        "qwen3_moe",
        {
            "parallel": {"expert_parallel_size": 2},
            "engine_kwargs": {"moe_aux_loss_coeff": 0.05},
        },
    ),
}
FSDP_OPTIONS = {
    "ep2-aux": {
        "engine_kwargs": {"moe_aux_loss_coeff": 0.05},
        "micro_batch": {"micro_batch_size": 4},
    }
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("equiv")
    return {
        t: megatron_models.save_model(str(root / t), t) for t in ("qwen2", "llama", "qwen3_moe")
    }


@pytest.fixture(scope="module")
def fsdp_results(model_dirs):
    runner = SpawnRunner.shared(1)
    cache = {}

    def get(model_type, options, extra):
        key = (model_type, repr(options.get("model")), repr(extra))
        if key not in cache:
            fsdp_options = {"model": options["model"]} if "model" in options else {}
            fsdp_options.update(extra)
            (cache[key],) = runner.run(
                megatron_cases.one_update, "fsdp", model_dirs[model_type], fsdp_options
            )
        return cache[key]

    return get


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_megatron_matches_fsdp_and_hf(layout, model_dirs, fsdp_results):
    model_type, options = LAYOUTS[layout]
    results = SpawnRunner.shared(2).run(
        megatron_cases.one_update, "megatron", model_dirs[model_type], options
    )
    want = fsdp_results(model_type, options, FSDP_OPTIONS.get(layout, {}))
    got_lp = megatron_cases.gather_dp(results, "log_probs")
    got_ent = megatron_cases.gather_dp(results, "entropy")
    if "override_config" not in str(options):  # float64 HF reference on the saved weights
        ref = reference_outputs(model_dirs[model_type], make_rl_batch(num_seqs=8))
        torch.testing.assert_close(got_lp.double(), ref["log_probs"], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(got_ent.double(), ref["entropy"], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(got_lp, want["log_probs"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_ent, want["entropy"], atol=1e-5, rtol=1e-5)
    for r in results:  # identical metrics on every rank
        assert r["metrics"] == results[0]["metrics"]
    m, f = results[0]["metrics"], want["metrics"]
    assert m["loss"] == pytest.approx(f["loss"], rel=1e-5, abs=1e-7)
    assert m["grad_norm"] == pytest.approx(f["grad_norm"], rel=1e-5)
    moe_keys = {k for k in f if k.startswith("moe/")} - {"moe/load_balancing_loss"}
    if model_type == "qwen3_moe":  # router statistics over the step's real tokens
        assert moe_keys == {"moe/expert_load_max_over_mean", "moe/router_entropy"}
    if "moe_aux_loss_coeff" in str(options):
        moe_keys.add("moe/load_balancing_loss")
    for key in moe_keys:
        assert m[key] == pytest.approx(f[key], rel=1e-5), key
    for r in results:  # every rank exports the full, updated weights
        assert set(r["weights"]) == set(want["weights"])
        for name, tensor in want["weights"].items():
            torch.testing.assert_close(r["weights"][name], tensor, atol=2e-6, rtol=1e-5, msg=name)
    after = megatron_cases.gather_dp(results, "log_probs_after")
    torch.testing.assert_close(after, want["log_probs_after"], atol=2e-5, rtol=1e-4)
    assert not torch.allclose(after, got_lp)  # the step changed the model

"""Router replay in the megatron engine (megatron-core's replay hook) against the fsdp
engine's (Hugging Face router hooks), two independent implementations on the same weights
and the same forced routing: log-probs before, and after one AdamW step the loss, gradient
norm and log-probs; with expert parallelism and with tensor + sequence parallelism."""

from __future__ import annotations

import megatron_cases
import megatron_models
import pytest
import replay_cases
import torch

from rl_core.testing.spawn import SpawnRunner

pytestmark = [pytest.mark.megatron, pytest.mark.slow]

LAYOUTS = {
    "ep2": {"parallel": {"expert_parallel_size": 2}},
    "tp2-sp": {
        "parallel": {"tensor_parallel_size": 2},
        "engine_kwargs": {"sequence_parallel": True},
    },
}


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return megatron_models.save_model(str(tmp_path_factory.mktemp("replay")), "qwen3_moe")


@pytest.fixture(scope="module")
def fsdp_replayed(moe_dir):
    (result,) = SpawnRunner.shared(1).run(replay_cases.replayed_update, "fsdp", moe_dir, {})
    (plain,) = SpawnRunner.shared(1).run(megatron_cases.one_update, "fsdp", moe_dir, {})
    result["plain_log_probs"] = plain["log_probs"]  # the model's own routing
    return result


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_megatron_replays_the_routing_as_the_fsdp_engine_does(layout, moe_dir, fsdp_replayed):
    results = SpawnRunner.shared(2).run(
        replay_cases.replayed_update, "megatron", moe_dir, LAYOUTS[layout]
    )
    got = megatron_cases.gather_dp(results, "log_probs")
    torch.testing.assert_close(got, fsdp_replayed["log_probs"], atol=1e-5, rtol=1e-5)
    # the replay matters: the model's own routing gives other log-probs
    assert (fsdp_replayed["plain_log_probs"] - got).abs().max() > 1e-3
    m, f = results[0]["metrics"], fsdp_replayed["metrics"]
    assert m["loss"] == pytest.approx(f["loss"], rel=1e-5, abs=1e-7)
    assert m["grad_norm"] == pytest.approx(f["grad_norm"], rel=1e-5)
    after = megatron_cases.gather_dp(results, "log_probs_after")
    torch.testing.assert_close(after, fsdp_replayed["log_probs_after"], atol=2e-5, rtol=1e-4)
    # the router statistics count the replayed experts on both engines
    for key in ("moe/expert_load_max_over_mean", "moe/router_entropy"):
        assert m[key] == pytest.approx(f[key], rel=1e-5), key
    # most forced expert sets differ from the router's own choice, on both engines
    assert 0.5 < m["moe/router_replay_changed_fraction"] <= 1.0
    assert 0.5 < f["moe/router_replay_changed_fraction"] <= 1.0


def test_megatron_refuses_replay_on_a_dense_model(tmp_path):
    dense = megatron_models.save_model(str(tmp_path / "dense"), "qwen2")
    (err,) = SpawnRunner.shared(1).run(
        megatron_cases.construction_error, dense, {"router_replay": True}
    )
    assert err is not None and (err["path"], err["value"]) == ("router_replay", True)
    assert "dense" in err["expected"] and "\n" not in err["text"]

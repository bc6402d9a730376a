"""Router replay in the fsdp engine (`rl_engines.router_replay`): replaying the router's own
choice changes nothing, in the padded and the packed layout; a forced routing changes the
log-probs, the same way in both layouts; -1 keeps the router's choice; bad input is refused."""

from __future__ import annotations

import megatron_models
import pytest
import replay_cases
import torch

from rl_core.testing.spawn import SpawnRunner
from rl_engines.router_replay import ReplayCounts, replayed_topk


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return megatron_models.save_model(str(tmp_path_factory.mktemp("replay")), "qwen3_moe")


def test_replayed_topk_keeps_the_routers_choice_where_nothing_was_recorded():
    own = torch.tensor([[0, 1], [2, 3], [1, 2]])
    recorded = torch.tensor([[3, 2], [-1, -1], [2, 1]], dtype=torch.int16)
    forced = replayed_topk(own, recorded, num_experts=4)
    assert forced.tolist() == [[3, 2], [2, 3], [2, 1]]
    counts = ReplayCounts()
    counts.add(own, forced, (recorded >= 0).all(-1))
    # row 2 holds the same experts in another order: not a change
    assert (counts.replayed, counts.changed) == (2, 1)
    assert counts.take() == {"moe/router_replay_changed_fraction": 0.5}
    with pytest.raises(ValueError, match=r"expert id 4: expected ids in \[0, 4\) or -1"):
        replayed_topk(own, torch.full((3, 2), 4), num_experts=4)


def test_replay_in_the_padded_and_packed_layouts(moe_dir):
    (res,) = SpawnRunner.shared(1).run(replay_cases.replay_layouts, moe_dir)
    for packed in (False, True):
        plain = res[f"plain/{packed}"]
        # the router's own routing (from a separate Hugging Face forward) replayed: the same
        torch.testing.assert_close(res[f"own/{packed}"], plain, atol=1e-6, rtol=1e-6)
        assert res[f"own/{packed}/counts"]["changed"] == 0
        assert res[f"own/{packed}/counts"]["replayed"] > 100
        # a forced routing moves the log-probs
        assert (res[f"forced/{packed}"] - plain).abs().max() > 1e-3
        assert (
            res[f"forced/{packed}/counts"]["changed"]
            > res[f"forced/{packed}/counts"]["replayed"] / 2
        )
    # ... and the token order is right in both layouts: they agree
    torch.testing.assert_close(res["forced/False"], res["forced/True"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(res["plain/False"], res["plain/True"], atol=1e-5, rtol=1e-5)


def test_bad_input_is_refused_in_one_line(moe_dir, tmp_path):
    dense = megatron_models.save_model(str(tmp_path / "dense"), "qwen2")
    (errors,) = SpawnRunner.shared(1).run(replay_cases.replay_errors, moe_dir, dense)
    path, value, expected = errors["dense"].split("|")
    assert (path, value) == ("router_replay", "True")
    assert "dense model 'qwen2'" in expected
    assert "has no 'routed_experts' field" in errors["missing"]
    assert "expert id 4: expected ids in [0, 4)" in errors["bad_id"]
    assert "[batch, seq, 2 MoE layers, top_k]" in errors["bad_shape"]
    assert all("\n" not in e for e in errors.values())

"""Megatron start-up per rank: weights streamed from the checkpoint (each rank keeps its
TP/PP shards) equal main's whole-model build bit for bit, and `ShardedAdamW` (AdamW state
partitioned over data-parallel ranks) updates exactly as a full AdamW per rank, matches a
single-rank run to float32 tolerance, holds half the state at DP=2 and resumes exactly
from a checkpoint."""

from __future__ import annotations

import megatron_init_cases as cases
import megatron_models
import pytest
import torch

from rl_core.testing.spawn import SpawnRunner

pytestmark = [pytest.mark.megatron]


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return megatron_models.save_model(str(tmp_path_factory.mktemp("mg-qwen2")), "qwen2")


def _equal(a: dict, b: dict) -> list[str]:
    assert a.keys() == b.keys()
    return [n for n in a if not torch.equal(a[n], b[n])]


def test_dp2_sharded_optimizer_equals_full_adamw_and_dp1(qwen2):
    runner = SpawnRunner.shared(2)
    new = runner.run(cases.run, qwen2, {}, False, 2)
    old = runner.run(cases.run, qwen2, {}, True, 2)
    assert all(r["sharded"] for r in new) and not any(r["sharded"] for r in old)
    assert not _equal(new[0]["start"], old[0]["start"])  # streamed weights: bit-identical
    assert not _equal(new[0]["after"], old[0]["after"])  # same updates as a full AdamW
    assert not _equal(new[0]["after"], new[1]["after"])  # every rank holds all of them
    assert _equal(new[0]["start"], new[0]["after"])  # two steps changed the weights
    assert [m["loss"] for m in new[0]["metrics"]] == [m["loss"] for m in old[0]["metrics"]]
    # half the AdamW state per rank (plus at most one padding element per partition)
    full = old[0]["optimizer_bytes"]
    assert all(r["optimizer_bytes"] <= full / 2 + 64 for r in new)
    assert all(r["optimizer_bytes"] >= 0.45 * full for r in new)  # main: a step per tensor
    # a single rank on the whole batch: the same update up to float32 summation order
    single = SpawnRunner.shared(1).run(cases.run, qwen2, {}, False, 2)[0]
    assert full - 64 < single["optimizer_bytes"] <= full  # one step tensor, not one per param
    for name, tensor in single["after"].items():
        torch.testing.assert_close(new[0]["after"][name], tensor, atol=2e-6, rtol=1e-5)


def test_sharded_optimizer_checkpoint_resumes_exactly(qwen2, tmp_path):
    runner = SpawnRunner.shared(2)
    ckpt = str(tmp_path / "ckpt")
    straight = runner.run(cases.run, qwen2, {}, False, 2, save_to=ckpt)  # saves after step 1
    resumed = runner.run(cases.run, qwen2, {}, False, 1, load_from=ckpt, first_batch=1)
    assert _equal(resumed[0]["start"], straight[0]["start"])  # the checkpoint was loaded
    # equal only if parameters, both AdamW moments of every rank's range and the step
    # count (bias correction) all came back
    for a, b in zip(resumed, straight):
        assert not _equal(a["after"], b["after"])
        assert a["metrics"][0]["loss"] == b["metrics"][1]["loss"]


@pytest.mark.parametrize(
    ("model_type", "options"),
    [
        ("qwen2", {"parallel": {"tensor_parallel_size": 2}}),
        ("llama", {"parallel": {"pipeline_parallel_size": 2}}),
        ("qwen3_moe", {"parallel": {"expert_parallel_size": 2}}),
        ("llama", {"model": {"value_head": True}}),
    ],
    ids=["tp2", "pp2", "ep2", "value-head-dp2"],
)
def test_streamed_weights_equal_whole_model_build(tmp_path, model_type, options):
    model = megatron_models.save_model(str(tmp_path / model_type), model_type)
    runner = SpawnRunner.shared(2)
    new = runner.run(cases.run, model, options, False, 1)
    old = runner.run(cases.run, model, options, True, 1)
    for a, b in zip(new, old):
        assert not _equal(a["start"], b["start"])
        assert not _equal(a["after"], b["after"])

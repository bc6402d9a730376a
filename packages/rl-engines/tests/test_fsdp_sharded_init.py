"""Per-rank initialisation (`rl_engines.fsdp.sharded_load`) gives bit-identical weights,
buffers and first training step to the eager build (whole model per rank, then shard), for
every model source: a tied-embedding checkpoint, a value head from a causal-LM checkpoint
(head initialised from the seed), LoRA adapters, a config-only random model, a MoE whose
experts are fused on load, and a Qwen2-VL whose checkpoint keys are renamed on load."""

from __future__ import annotations

import importlib.util

import init_cases
import pytest
import torch

from rl_core.testing.spawn import SpawnRunner

CASES = ["tied_qwen2", "value_head_from_causal", "lora", "config_only", "moe", "vlm"]
NO_PEFT = importlib.util.find_spec("peft") is None


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    return init_cases.save_sources(str(tmp_path_factory.mktemp("init-sources")))


def _assert_same(eager: dict, sharded: dict, what: str) -> None:
    assert eager.keys() == sharded.keys(), what
    different = [n for n in eager if not torch.equal(eager[n], sharded[n])]
    assert not different, f"{what}: {different[:5]}"
    dtypes = [n for n in eager if eager[n].dtype != sharded[n].dtype]
    assert not dtypes, f"{what}: dtypes differ for {dtypes[:5]}"


def _check(results: list, case: str) -> None:
    eager, sharded = results[0]["eager"], results[0]["sharded"]
    assert len(eager["state"]) > 0
    _assert_same(eager["state"], sharded["state"], f"{case} at start")
    assert eager["trainable"] == sharded["trainable"], case  # frozen towers, LoRA bases
    assert eager["trainable"], case
    buffers = [n for n in eager["state"] if n.startswith("buffer:")]
    assert any("inv_freq" in n for n in buffers), case  # rotary buffers are compared
    for result in results:  # every rank's step: same loss and gradient norm
        assert result["eager"]["loss"] == result["sharded"]["loss"], case
        assert result["eager"]["grad_norm"] == result["sharded"]["grad_norm"], case
    _assert_same(eager["after"], sharded["after"], f"{case} after one step")
    assert not all(  # the step changed something: the comparison after it is not vacuous
        torch.equal(eager["state"][n], eager["after"][n]) for n in eager["after"]
    ), case


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("case", CASES)
def test_sharded_init_is_bit_identical(sources, world_size, case):
    if case == "lora" and NO_PEFT:
        pytest.skip("LoRA needs peft (rl-engines[lora])")
    results = SpawnRunner.shared(world_size).run(init_cases.build_both_ways, sources[case])
    _check(results, case)


def test_sharded_init_hsdp_is_bit_identical(sources):
    """2 replicas of 1 shard: the mesh is 2-D, each rank holds whole tensors."""
    options = {**sources["tied_qwen2"], "parallel": {"replicate_size": 2, "fsdp_size": 1}}
    results = SpawnRunner.shared(2).run(init_cases.build_both_ways, options)
    _check(results, "hsdp")

"""The megatron engine in bf16 (megatron-core's Float16Module, fp32 main parameters) on
CPU at TP=2 + sequence parallel, PP=2 with virtual stages and EP=2: log-probs within twice
the plain Hugging Face model's own bf16-vs-fp32 gap of the fp32 run, one finite training
step that changes the weights while the master weights and optimizer state stay fp32,
and checkpoints that keep the fp32 master weights (`bf16_cases`)."""

from __future__ import annotations

import bf16_cases
import megatron_models
import pytest
import torch

from rl_core.testing.spawn import SpawnRunner

pytestmark = [pytest.mark.megatron, pytest.mark.slow]

LAYOUTS = {
    "tp2-sp": (
        "llama",
        {"parallel": {"tensor_parallel_size": 2}, "engine_kwargs": {"sequence_parallel": True}},
    ),
    "pp2-vpp2": (
        "llama4",
        {"parallel": {"pipeline_parallel_size": 2}, "engine_kwargs": {"virtual_pipeline_size": 2}},
    ),
    "ep2": ("qwen3_moe", {"parallel": {"expert_parallel_size": 2}}),
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16")
    return {
        "llama": megatron_models.save_model(str(root / "llama"), "llama"),
        "llama4": megatron_models.save_llama4(str(root / "llama4")),
        "qwen3_moe": megatron_models.save_model(str(root / "moe"), "qwen3_moe"),
    }


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_bf16_is_close_to_fp32_and_trains(layout, model_dirs):
    model, options = LAYOUTS[layout]
    results = SpawnRunner.shared(2).run(bf16_cases.one_step, "megatron", model_dirs[model], options)
    bf16_cases.check(results, model_dirs[model])


def test_bf16_checkpoint_keeps_fp32_master_weights(model_dirs, tmp_path):
    from rl_engines.megatron import MegatronEngine

    path = str(tmp_path / "ckpt")
    _, options = LAYOUTS["tp2-sp"]
    results = SpawnRunner.shared(2).run(
        bf16_cases.megatron_checkpoint, model_dirs["llama"], options, path
    )
    offline = MegatronEngine.read_checkpoint_weights(path)
    for r in results:
        assert r["rounded"]
        assert set(r["loaded"]) == set(r["saved"])
        for name, tensor in r["saved"].items():
            assert tensor.dtype == torch.float32
            assert torch.equal(r["loaded"][name], tensor), name  # not rounded through bf16
            assert torch.equal(offline[name], tensor), name
    # the master weights are not bf16 values (they were never rounded through the model)
    embed = results[0]["saved"]["model.embed_tokens.weight"]
    assert not torch.equal(embed, embed.bfloat16().float())

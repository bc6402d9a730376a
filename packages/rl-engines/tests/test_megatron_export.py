"""`rl export` of megatron checkpoints: a checkpoint saved at TP=2, PP=2 or EP=2 becomes a
Hugging Face directory (safetensors, config, generation config, tokenizer files) whose
transformers log-probs equal the megatron engine's on the same tokens."""

from __future__ import annotations

import json
import os

import megatron_cases
import megatron_models
import pytest
import torch

from rl_core.engine import ENGINES
from rl_core.testing.spawn import SpawnRunner
from rl_core.testing.train_engine import make_rl_batch, reference_outputs, save_tiny_model

pytestmark = [pytest.mark.megatron, pytest.mark.slow]

LAYOUTS = {
    "tp2": ("qwen2", {"parallel": {"tensor_parallel_size": 2}}),
    "pp2": ("llama", {"parallel": {"pipeline_parallel_size": 2}}),
    "ep2": ("qwen3_moe", {"parallel": {"expert_parallel_size": 2}}),
}


def _model_dir(root, model_type: str) -> str:
    path = str(root / model_type)
    if model_type == "qwen3_moe":
        megatron_models.save_tiny_moe(path)
    else:
        save_tiny_model(path, model_type)
    # files an export must carry over next to the weights
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"model_max_length": 256, "pad_token": "<pad>"}, f)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": 2, "max_new_tokens": 7}, f)
    return path


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_exported_megatron_checkpoint_matches_the_engine(layout, tmp_path):
    export = pytest.importorskip("rl_algos.export")
    model_type, options = LAYOUTS[layout]
    model_dir = _model_dir(tmp_path, model_type)
    ckpt = str(tmp_path / "ckpt")
    results = SpawnRunner.shared(2).run(megatron_cases.update_and_save, model_dir, options, ckpt)
    engine_lp = megatron_cases.gather_dp(results, "log_probs")
    out = export.export_checkpoint(ckpt, tmp_path / "hf", model=model_dir)
    files = set(os.listdir(out))
    assert {"model.safetensors", "config.json", "generation_config.json"} <= files, files
    assert "tokenizer_config.json" in files and "rl_export.json" in files
    with open(out / "generation_config.json") as f:
        assert json.load(f)["max_new_tokens"] == 7
    provenance = json.loads((out / "rl_export.json").read_text())
    assert provenance["engine"] == "megatron" and provenance["step"] == 1
    if model_type == "qwen3_moe":  # float64 reference: see megatron_models.save_tiny_moe
        config = json.loads((out / "config.json").read_text())
        config["experts_implementation"] = "eager"
        (out / "config.json").write_text(json.dumps(config))
    ref = reference_outputs(str(out), make_rl_batch(num_seqs=8))
    torch.testing.assert_close(engine_lp.double(), ref["log_probs"], atol=2e-5, rtol=1e-4)
    # the update moved the weights: the exported model is not the initial one
    initial = reference_outputs(model_dir, make_rl_batch(num_seqs=8))
    assert not torch.allclose(initial["log_probs"], ref["log_probs"], atol=1e-4)


def test_reading_a_checkpoint_without_the_model_config_names_the_problem(tmp_path):
    model_dir = _model_dir(tmp_path, "qwen2")
    ckpt = str(tmp_path / "ckpt")
    SpawnRunner.shared(2).run(megatron_cases.update_and_save, model_dir, LAYOUTS["tp2"][1], ckpt)
    meta_file = os.path.join(ckpt, "meta.json")
    with open(meta_file) as f:
        meta = json.load(f)
    meta.pop("hf_config")
    with open(meta_file, "w") as f:
        json.dump(meta, f)
    from rl_core.checkpoint import write_manifest

    write_manifest(ckpt, {"engine": "megatron"})  # a consistent, older-style checkpoint
    with pytest.raises(ValueError, match="records no hf_config"):
        ENGINES.get("megatron").read_checkpoint_weights(ckpt)

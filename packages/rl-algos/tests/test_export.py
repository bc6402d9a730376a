"""`rl export` of a builder model (``rl_model.json`` beside the HF files), offline."""

from __future__ import annotations

import json

import pytest
import torch

from rl_algos import export


@pytest.fixture
def builder_checkpoint(tmp_path, monkeypatch):
    """An engine checkpoint of a tiny Llama under ``vlm.`` plus one head tensor, whose
    ``rl_model.json`` names no ``extra_file`` (the default file name applies)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=16,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    hf_dir = tmp_path / "hf"
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(hf_dir)
    (hf_dir / "model.safetensors").unlink()
    (hf_dir / "rl_model.json").write_text(json.dumps({"hf_prefix": "vlm."}))
    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    (engine_dir / "meta.json").write_text(json.dumps({"engine": "fake", "step": 3}))
    torch.manual_seed(1)
    trained = LlamaForCausalLM(config).state_dict()
    weights = {f"vlm.{k}": v for k, v in trained.items()}
    weights["value_head.weight"] = torch.arange(8.0).reshape(1, 8)
    monkeypatch.setattr(export, "read_weights", lambda source, merge_lora=True: dict(weights))
    return engine_dir, hf_dir, trained


def test_builder_model_without_extra_file_uses_the_default_name(builder_checkpoint, tmp_path):
    from safetensors.torch import load_file

    engine_dir, hf_dir, trained = builder_checkpoint
    out = export.export_checkpoint(engine_dir, tmp_path / "out", model=str(hf_dir))
    heads = load_file(out / "extra_weights.safetensors")
    assert list(heads) == ["value_head.weight"]
    torch.testing.assert_close(heads["value_head.weight"], torch.arange(8.0).reshape(1, 8))
    model = load_file(out / "model.safetensors")
    assert "value_head.weight" not in model
    torch.testing.assert_close(
        model["model.embed_tokens.weight"], trained["model.embed_tokens.weight"]
    )
    assert json.loads((out / "rl_model.json").read_text()) == {"hf_prefix": "vlm."}
    assert json.loads((out / "rl_export.json").read_text())["step"] == 3

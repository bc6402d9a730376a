"""LoRA (PEFT) on the fsdp engine, 2 ranks: only adapters train, the exported weights are
the merged model, the reference (adapters disabled) is the base model, and checkpoints
give the same weights offline (merged) or as a PEFT adapter."""

from __future__ import annotations

import fsdp_cases
import pytest
import torch

from rl_core.testing.spawn import SpawnRunner
from rl_core.testing.train_engine import reference_outputs, save_tiny_model

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    model_dir = save_tiny_model(str(tmp_path_factory.mktemp("lora-llama")), "llama")
    ckpt = str(tmp_path_factory.mktemp("lora-ckpt") / "ckpt")
    results = SpawnRunner.shared(2).run(fsdp_cases.lora_round, model_dir, ckpt)
    return model_dir, ckpt, results


def _cat(results, key):
    return torch.cat([r[key] for r in results])  # ranks hold consecutive row chunks


def test_only_adapters_train_and_export_is_merged(lora_run):
    model_dir, _, results = lora_run
    trainable = results[0]["trainable"]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert any("mlp.down_proj" in n for n in trainable)  # all-linear reaches the MLP
    before, after = results[0]["before"], results[0]["after"]
    assert set(after) == set(before)  # plain Hugging Face names, no PEFT prefixes
    assert not any("lora" in n or "base_layer" in n for n in after)
    assert torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
    changed = [n for n in after if not torch.equal(after[n], before[n])]
    assert "model.layers.0.self_attn.q_proj.weight" in changed
    assert "lm_head.weight" not in changed  # the output head is not an adapter target

    probe = fsdp_cases.batch_for_step(9)
    mask = probe.batch["response_mask"].bool()
    # independent float64 forward of the exported (merged) weights = the engine with adapters
    merged = reference_outputs(model_dir, probe, 1.0, state_dict=after)["log_probs"]
    engine = _cat(results, "with_adapters").double()
    torch.testing.assert_close(engine[mask], merged[mask], atol=2e-5, rtol=1e-4)
    # adapters disabled = the untouched base model from disk: the reference, without a copy
    base = reference_outputs(model_dir, probe, 1.0)["log_probs"]
    torch.testing.assert_close(
        _cat(results, "base").double()[mask], base[mask], atol=2e-5, rtol=1e-4
    )
    assert (engine[mask] - base[mask]).abs().max() > 1e-3


def test_checkpoint_reads_merged_or_as_peft_adapter(lora_run, tmp_path):
    from peft import PeftModel
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from rl_core.engine import LoRAConfig
    from rl_engines.fsdp import FSDPEngine
    from rl_engines.lora import peft_config

    model_dir, ckpt, results = lora_run
    merged = FSDPEngine.read_checkpoint_weights(ckpt)
    for name, tensor in results[0]["after"].items():
        torch.testing.assert_close(merged[name], tensor, atol=1e-6, rtol=1e-6)
    adapter = FSDPEngine.read_checkpoint_weights(ckpt, merge_lora=False)
    assert adapter and all(n.startswith("base_model.model.") for n in adapter)
    assert all(n.endswith((".lora_A.weight", ".lora_B.weight")) for n in adapter)
    # PEFT itself loads the adapter onto the base model and merges it to the same weights
    lora = LoRAConfig(**fsdp_cases.LORA["model"]["lora"])
    out = tmp_path / "adapter"
    peft_config(lora).save_pretrained(out)
    save_file(adapter, out / "adapter_model.safetensors")
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), out)
    state = model.merge_and_unload().state_dict()
    for name, tensor in results[0]["after"].items():
        torch.testing.assert_close(state[name], tensor, atol=1e-5, rtol=1e-5)

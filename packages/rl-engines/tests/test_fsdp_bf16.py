"""The fsdp engine with compute_dtype=bfloat16 on CPU (FSDP2's MixedPrecisionPolicy, fp32
master weights): the padded and the packed (use_remove_padding) layouts, shared prompts
and LoRA each give log-probs within twice the plain Hugging Face model's own
bf16-vs-fp32 gap of their fp32 run, and train one finite step that changes the weights
while the master weights and optimizer state stay fp32 (`bf16_cases`)."""

from __future__ import annotations

import bf16_cases
import fsdp_cases
import pytest

from rl_core.testing.spawn import SpawnRunner
from rl_core.testing.train_engine import save_tiny_model

pytestmark = pytest.mark.slow

CASES = {
    "padded": ({}, False),
    "packed": (
        {
            "engine_kwargs": {"use_remove_padding": True},
            "micro_batch": {"max_tokens_per_micro_batch": 48},
        },
        False,
    ),
    "shared-prompts": (
        {"engine_kwargs": {"share_prompts": True}, "micro_batch": {"micro_batch_size": 2}},
        True,
    ),
    "lora": (fsdp_cases.LORA, False),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("bf16-llama")), "llama")


@pytest.mark.parametrize("case", list(CASES))
def test_bf16_is_close_to_fp32_and_trains(case, model_dir):
    if case == "lora":
        pytest.importorskip("peft")
    options, grouped = CASES[case]
    results = SpawnRunner.shared(2).run(bf16_cases.one_step, "fsdp", model_dir, options, grouped)
    bf16_cases.check(results, model_dir, grouped)
    if case == "shared-prompts":
        assert all(r["bfloat16"]["shared"] for r in results)
    if case == "lora":  # only adapters train; the export is the merged model
        changed = results[0]["bfloat16"]["changed"]
        assert "model.layers.0.self_attn.q_proj.weight" in changed
        assert "model.embed_tokens.weight" not in changed

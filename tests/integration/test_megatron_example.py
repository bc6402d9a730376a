"""`rl train examples/grpo_tiny_moe.yaml`: a tiny Qwen3-MoE trained by the megatron engine
with expert parallelism over 2 processes (HF rollout on CPU), 2 GRPO steps."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_algos.trainer.tracking import read_jsonl

pytestmark = [pytest.mark.megatron, pytest.mark.slow, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "grpo_tiny_moe.yaml"
RL = Path(sys.executable).with_name("rl")


def test_grpo_tiny_moe_trains_with_megatron_expert_parallelism(tmp_path):
    pytest.importorskip("megatron.core")
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="disabled", RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    proc = subprocess.run(
        [str(RL), "train", str(EXAMPLE), f"trainer.output_dir={out}", "trainer.loggers=[jsonl]"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=1400,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    history = read_jsonl(out / "metrics.jsonl")
    steps = [h for h in history if h.get("step", 0) >= 1 and "actor/grad_norm" in h]
    assert [h["step"] for h in steps] == [1, 2], history
    for h in steps:
        assert math.isfinite(h["actor/loss"]) and h["actor/grad_norm"] > 0, h
        # the load-balancing loss of the MoE layers is tracked and logged
        assert h["moe/load_balancing_loss"] > 0 and math.isfinite(h["moe/load_balancing_loss"]), h
    assert (out / "checkpoints" / "latest").read_text() == "step_2"

"""The colocated GRPO step through the trainer on the stand-in accelerator, whose process
groups refuse host tensors as NCCL does: rollout, log-probs, update, the in-process weight
sync into the hf rollout, a checkpoint save and validation, with two FSDP2 workers. What a
first 2-GPU run would hit, found on a CPU machine (`nox -s tests-device`)."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest

from rl_core.testing.spawn import SpawnRunner

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the spawned process imports the cases module by name
import standin_trainer_cases  # noqa: E402

pytestmark = pytest.mark.device


def test_colocated_grpo_steps_on_the_standin_device(raw_config, tmp_path):
    raw = raw_config(tmp_path / "run", "grpo")
    overrides = [
        "trainer.platform=standin",
        "trainer.total_steps=1",
        "trainer.save_every=1",
        "trainer.val_every=1",
        "rollout.n=2",
    ]
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    with SpawnRunner(1, timeout_s=600.0, env={"PYTHONPATH": path}) as runner:
        (result,) = runner.run(standin_trainer_cases.grpo_on_standin, raw, overrides)
    assert result["steps"][-1] == 1, result["steps"]
    trained = [m for m in result["metrics"] if "actor/loss" in m]
    assert [m["step"] for m in trained] == [1]
    assert all(math.isfinite(m["actor/loss"]) and m["actor/grad_norm"] > 0 for m in trained)
    assert all(m["timing/sync_weights_s"] > 0 for m in trained)
    assert any("val/" in k for m in result["metrics"] for k in m), result["metrics"][-1]
    assert result["checkpoints"] == ["latest", "step_1"], result["checkpoints"]

"""Exact resume: 6 steps in one run equal 3 steps, then `rl train ... trainer.resume=latest`
in a new process for the other 3, metric by metric and weight by weight.

The run exercises every piece of state a resume must restore: DAPO's dynamic sampling
(several generation rounds per step move the dataloader by a varying number of batches),
an adaptive KL coefficient in the reward, a reference model, two mini-batches and two
epochs per step (seeded shuffles), validation, the optimizer and the per-row sampling seeds.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from rl_algos.config import load_config
from rl_algos.trainer.loop import RLTrainer
from rl_algos.trainer.tracking import read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.ray]

HERE = Path(__file__).resolve().parent
OVERRIDES = [
    "reward.function_name=starts_with_target",
    "actor.loss.kl_loss_coef=0.001",
    "algorithm.use_kl_in_reward=true",
    "algorithm.kl_ctrl.type=adaptive",
    "algorithm.kl_ctrl.horizon=10",
    "actor.epochs=2",
    "trainer.total_steps=6",
    "trainer.save_every=3",
    "trainer.val_every=3",
    "trainer.val_before_train=true",
]
# Wall-clock measurements differ between any two runs; everything else must not.
WALL_CLOCK = ("timing/", "perf/", "reward/seconds")


def _train_in_process(raw: dict[str, Any], overrides: list[str]) -> None:
    trainer = RLTrainer(load_config(raw, overrides))
    try:
        trainer.fit()
    finally:
        trainer.close()


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flat(value, f"{prefix}{key}/"))
        return out
    if isinstance(tree, list | tuple):
        return _flat(dict(enumerate(tree)), prefix)
    return {prefix.rstrip("/"): tree}


def _engine_state(checkpoint: Path, scratch: Path) -> dict[str, Any]:
    """Model and optimizer state of an engine checkpoint (DCP), as full tensors."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = scratch / f"{checkpoint.parent.parent.parent.name}-{checkpoint.name}.pt"
    dcp_to_torch_save(checkpoint, out)
    return _flat(torch.load(out, weights_only=True))


def test_resume_in_a_new_process_continues_exactly(ray_cluster, raw_config, tmp_path):
    # one run of 6 steps
    whole = raw_config(tmp_path / "whole", "dapo")
    _train_in_process(whole, OVERRIDES)

    # 3 steps here, then a new process resumes from `latest` and does the other 3
    parts_dir = tmp_path / "parts"
    parts = raw_config(parts_dir, "dapo")
    _train_in_process(parts, [*OVERRIDES, "trainer.total_steps=3"])
    root = parts_dir / "checkpoints"
    assert (root / "latest").read_text() == "step_3"
    # a later checkpoint write that died midway left its temporary files behind
    shutil.copytree(root / "step_3", root / ".step_6.partial")
    (root / ".step_6.partial" / "manifest.json").unlink()
    (root / "latest.tmp").write_text("step_6")
    config_file = tmp_path / "parts.yaml"
    OmegaConf.save(OmegaConf.create(parts), config_file)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    rl = Path(sys.executable).with_name("rl")  # the console script of this environment
    command = [str(rl), "train", str(config_file), *OVERRIDES]
    proc = subprocess.run(
        [*command, "trainer.resume=latest"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"resumed from {root / 'step_3'} at step 3" in proc.stderr

    # metric by metric: the JSONL of the resumed run keeps steps 0..3 and continues
    rows_whole = read_jsonl(tmp_path / "whole" / "metrics.jsonl")
    rows_parts = read_jsonl(parts_dir / "metrics.jsonl")
    assert [r["step"] for r in rows_whole] == [0, 1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in rows_parts] == [r["step"] for r in rows_whole]
    compared = 0
    for a, b in zip(rows_whole, rows_parts):
        keys_a = {k for k in a if not k.startswith(WALL_CLOCK)}
        keys_b = {k for k in b if not k.startswith(WALL_CLOCK)}
        assert keys_a == keys_b, (a["step"], keys_a ^ keys_b)
        for key in sorted(keys_a):
            # bitwise: the same seeds, data order and shapes give the same floats
            assert a[key] == b[key] or (math.isnan(a[key]) and math.isnan(b[key])), (
                f"step {a['step']} {key}: {a[key]!r} (one run) != {b[key]!r} (resumed)"
            )
            compared += 1
    assert compared > 200
    gen_rounds = [r["dapo/gen_rounds"] for r in rows_whole[1:]]
    assert max(gen_rounds) > 1, gen_rounds  # the dataloader moved unevenly
    # the adaptive KL coefficient moved, so its restored value mattered
    assert len({r["actor/reward_kl_penalty_coeff"] for r in rows_whole[1:]}) == 6

    # weight by weight (and the optimizer's moments), and the trainer's own state
    final_whole = tmp_path / "whole" / "checkpoints" / "step_6"
    final_parts = root / "step_6"
    state_whole = _engine_state(final_whole / "actor", tmp_path)
    state_parts = _engine_state(final_parts / "actor", tmp_path)
    assert state_whole.keys() == state_parts.keys()
    tensors = [k for k, v in state_whole.items() if isinstance(v, torch.Tensor)]
    assert len([k for k in tensors if k.startswith("model/")]) >= 20
    for key in tensors:
        assert torch.equal(state_whole[key], state_parts[key]), key
    halfway = _engine_state(root / "step_3" / "actor", tmp_path)
    assert not all(torch.equal(halfway[k], state_whole[k]) for k in tensors)  # it trained
    assert json.loads((final_whole / "trainer_state.json").read_text()) == json.loads(
        (final_parts / "trainer_state.json").read_text()
    )
    # the interrupted write never became `latest`; the resumed run replaced it
    assert (root / "latest").read_text() == "step_6"
    assert not (root / ".step_6.partial").exists()

"""The curriculum by kind (data.curriculum) in the trainer: with DAPO's dynamic sampling
(several generation rounds per step, every round observed), 4 steps in one run equal 2
steps, a checkpoint and 2 resumed steps: the same kinds drawn, the same running success
rates, the same metrics."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from rl_algos.config import load_config
from rl_algos.trainer.loop import RLTrainer
from rl_algos.trainer.tracking import read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.ray]

HERE = Path(__file__).resolve().parent
WALL_CLOCK = ("timing/", "perf/", "reward/seconds")


def _config(output_dir: Path, total_steps: int, resume: bool = False) -> Any:
    raw = {
        "model": {"path": "tiny-random:qwen2"},
        "data": {
            "generate": {
                "task": "arithmetic",
                "train_size": 64,
                "test_size": 8,
                "options": {"max_value": 20, "ops": ["+", "-"]},
            },
            "curriculum": {"enabled": True, "success_threshold": 0.2, "ema": 0.5},
            "max_prompt_length": 160,
            "max_response_length": 6,
            "train_batch_size": 4,
        },
        "algorithm": {"preset": "dapo"},
        "actor": {"optim": {"lr": 1e-2}, "mini_batch_size": 4},
        "rollout": {"n": 2},
        "reward": {"function_path": str(HERE / "digit_reward.py"), "num_workers": 0},
        "trainer": {
            "output_dir": str(output_dir),
            "total_steps": total_steps,
            "num_workers": 1,
            "ray_num_cpus": 2,
            "progress_bar": False,
            "loggers": ["jsonl"],
            "val_every": 0,
            "val_before_train": False,
            "save_every": 2,
            "resume": "latest" if resume else None,
            "call_timeout_s": 300,
        },
    }
    return load_config(raw, [])


def _fit(config: Any) -> None:
    trainer = RLTrainer(config)
    try:
        trainer.fit()
    finally:
        trainer.close()


def test_a_resumed_run_draws_the_same_kinds_and_prompts(ray_cluster, tmp_path):
    _fit(_config(tmp_path / "whole", 4))
    _fit(_config(tmp_path / "parts", 2))
    _fit(_config(tmp_path / "parts", 4, resume=True))
    whole = read_jsonl(tmp_path / "whole" / "metrics.jsonl")
    parts = read_jsonl(tmp_path / "parts" / "metrics.jsonl")
    assert [r["step"] for r in whole] == [r["step"] for r in parts] == [1, 2, 3, 4]
    kinds = sorted(k for k in whole[0] if k.startswith("curriculum/share/"))
    assert len(kinds) >= 4  # a+c, a+cd, ab-c, ... of the generated rows
    for a, b in zip(whole, parts, strict=True):
        keys = {k for k in a if not k.startswith(WALL_CLOCK)}
        assert keys == {k for k in b if not k.startswith(WALL_CLOCK)}
        for key in sorted(keys):
            assert a[key] == b[key] or (math.isnan(a[key]) and math.isnan(b[key])), (
                f"step {a['step']} {key}: {a[key]!r} (one run) != {b[key]!r} (resumed)"
            )
    # the rates moved away from the prior: the draw really followed the observations
    rates = {k: whole[-1][k] for k in whole[-1] if k.startswith("curriculum/success/")}
    assert any(rate != 0.5 for rate in rates.values())
    assert sum(whole[-1][f"curriculum/share/{k.split('/')[-1]}"] for k in kinds) == 1.0

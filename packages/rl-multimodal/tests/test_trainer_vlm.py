"""`rl train` plumbing for VLMs: examples/grpo_vlm_shapes.yaml runs two GRPO steps (images
through data, rollout, reward, log-probs, update, weight sync and validation)."""

from __future__ import annotations

import math
from pathlib import Path

from rl_algos.config import load_config
from rl_algos.trainer.loop import RLTrainer

EXAMPLE = Path(__file__).parents[3] / "examples" / "grpo_vlm_shapes.yaml"


def test_two_steps_of_the_example(tmp_path, monkeypatch):
    monkeypatch.setenv("RL_CACHE_DIR", str(tmp_path / "cache"))
    config = load_config(
        str(EXAMPLE),
        [
            f"trainer.output_dir={tmp_path / 'run'}",
            "trainer.total_steps=2",
            "trainer.val_every=2",
            "data.generate.train_size=16",
            "data.generate.test_size=8",
            "data.train_batch_size=4",
            "actor.mini_batch_size=4",
            "rollout.n=2",
        ],
    )
    trainer = RLTrainer(config)
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    assert [h["step"] for h in history] == [0, 1, 2]
    assert "val/accuracy" in history[0] and "val/accuracy" in history[-1]
    for h in history[1:]:
        assert math.isfinite(h["actor/pg_loss"]) and h["actor/grad_norm"] > 0
        assert h["response_length/max"] <= 2
    assert (
        tmp_path / "cache" / "models" / "tiny-random-vlm-qwen2_5_vl-v1" / "config.json"
    ).is_file()

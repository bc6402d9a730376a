"""examples/grpo_openai_agent.yaml through `rl train`'s trainer with the tiny random model:
the calculator agent (ordinary `openai` SDK code, examples/agents/calculator.py) runs in an
environment worker against the policy server for every episode, on the Ray backend with no
CPU settings; the trained rows are the recorded calls (first prompt, sampled tokens with
mask 1, the tool turn with mask 0). Learning itself is the example's job (README)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.timeout(600)]


def test_the_agent_example_trains_through_rl_train(tmp_path, monkeypatch):
    from rl_algos.config import load_config
    from rl_algos.trainer.loop import RLTrainer

    monkeypatch.chdir(ROOT)  # the example names its agent by a path from the repository root
    cfg = load_config(
        ROOT / "examples" / "grpo_openai_agent.yaml",
        [
            "model.path=tiny-random:qwen2",  # its byte-level vocabulary: longer prompts
            "data.max_prompt_length=400",
            "data.max_response_length=200",
            "data.train_batch_size=2",
            "rollout.n=2",
            "actor.mini_batch_size=2",
            "env.max_tokens_per_turn=16",
            "trainer.total_steps=1",
            "trainer.val_every=0",
            f"trainer.output_dir={tmp_path / 'run'}",
            "trainer.progress_bar=false",
            "trainer.loggers=[jsonl]",
        ],
    )
    assert cfg.trainer.ray_num_cpus is None and cfg.env.cpus_per_worker is None
    trainer = RLTrainer(cfg)
    updates = []
    update_actor = trainer.groups.actor.update_actor

    def recording(batch):
        updates.append(batch)
        return update_actor(batch)

    trainer.groups.actor.update_actor = recording
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    (step,) = [h for h in history if "env/episodes" in h]
    assert step["env/episodes"] == 4 and step["env/failed_episodes"] == 0
    (batch,) = updates
    mask = batch.batch["response_mask"]
    assert bool((mask.sum(1) >= 1).all())  # every row holds sampled tokens
    assert os.path.isfile(tmp_path / "run" / "metrics.jsonl")

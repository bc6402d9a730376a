"""Resume edge cases users of other RL frameworks run into (one in-process worker each,
``trainer.backend=local``):

* a checkpoint taken right at an epoch boundary resumes into the next epoch and trains on
  to ``trainer.total_steps`` (it does not stop with 0 steps), with a larger total_steps
  than the first run had: the result equals one uninterrupted run, metric by metric;
* a resume after the prompt file grew keeps the loader's position, says so in one line,
  and sees every prompt of the grown file exactly once in that epoch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from rl_algos.config import load_config
from rl_algos.data import write_rows
from rl_algos.trainer.loop import RLTrainer
from rl_algos.trainer.tracking import read_jsonl

pytestmark = [pytest.mark.faults, pytest.mark.slow]

WALL_CLOCK = ("timing/", "perf/", "reward/seconds")
LOCAL = ["trainer.backend=local", "trainer.num_workers=1", "actor.loss.kl_loss_coef=0"]


def _run(raw: dict[str, Any], overrides: list[str], seen: list[list[int]] | None = None):
    trainer = RLTrainer(load_config(raw, [*LOCAL, *overrides]))
    if seen is not None:
        draw = trainer._next_prompts

        def recorded():
            prompts = draw()
            seen.append([int(e["index"]) for e in prompts.non_tensor_batch["extra_info"]])
            return prompts

        trainer._next_prompts = recorded
    try:
        return trainer.fit()
    finally:
        trainer.close()


def _comparable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith(WALL_CLOCK)}


def test_resume_at_an_epoch_boundary_with_a_larger_total_steps(raw_config, tmp_path, caplog):
    # 32 prompts, 4 per step: step 8 ends epoch 0
    whole = _run(raw_config(tmp_path / "whole", "grpo"), ["trainer.total_steps=10"])
    parts_raw = raw_config(tmp_path / "parts", "grpo")
    saving = ["trainer.save_every=8"]  # step 8, and the last step
    first = _run(parts_raw, ["trainer.total_steps=8", *saving])
    assert [h["step"] for h in first] == list(range(1, 9))
    assert first[-1]["training/epoch"] == 0
    with caplog.at_level(logging.WARNING, logger="rl_algos.trainer.loop"):
        rest = _run(parts_raw, ["trainer.total_steps=10", "trainer.resume=latest", *saving])
    assert [h["step"] for h in rest] == [9, 10]  # not 0 steps
    assert [h["training/epoch"] for h in rest] == [1, 1]
    changed = [r.getMessage() for r in caplog.records if "total_steps=10" in r.getMessage()]
    assert len(changed) == 1 and "the checkpoint's run had 8" in changed[0]
    for a, b in zip(whole[8:], rest):
        assert _comparable(a) == _comparable(b), a["step"]
    rows = read_jsonl(tmp_path / "parts" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 11))
    # resuming the finished run changes nothing and says why, in one line
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rl_algos.trainer.loop"):
        assert _run(parts_raw, ["trainer.total_steps=10", "trainer.resume=latest", *saving]) == []
    assert any("nothing left to train" in r.getMessage() for r in caplog.records)


def test_resume_after_the_prompt_file_grew(raw_config, tmp_path, caplog):
    def _rows(words: list[str], offset: int) -> list[dict[str, Any]]:
        return [
            {
                "prompt": [{"role": "user", "content": f"Say {word}"}],
                "data_source": "digits",
                "reward_model": {"style": "rule", "ground_truth": "0123456789"},
                "extra_info": {"index": offset + i},
            }
            for i, word in enumerate(words)
        ]

    words = [f"w{i}" for i in range(32)]
    train = Path(write_rows(_rows(words, 0), tmp_path / "train.jsonl"))
    raw = raw_config(tmp_path / "run", "grpo")
    raw["data"]["train_files"] = [str(train)]
    seen: list[list[int]] = []
    _run(raw, ["trainer.total_steps=3", "trainer.save_every=3"], seen)
    # 8 prompts appended to the same file
    write_rows(_rows([*words, *(f"x{i}" for i in range(8))], 0), train)
    with caplog.at_level(logging.WARNING, logger="rl_algos.data.loader"):
        _run(raw, ["trainer.total_steps=10", "trainer.resume=latest"], seen)
    lines = [r.getMessage() for r in caplog.records if "grew" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "grew from 32 to 40 prompts" in lines[0] and "(epoch 0, batch 3)" in lines[0]
    assert len(seen) == 10
    epoch_0 = sorted(i for batch in seen for i in batch)
    assert epoch_0 == list(range(40))  # every prompt once, the new ones included

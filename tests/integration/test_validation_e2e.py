"""Trainer validation: n samples per prompt, pass@k / maj@k / mean@n per data source, and
scores without DAPO's overlong penalty (which the training reward still carries)."""

from __future__ import annotations

import pytest

from rl_algos.config import load_config
from rl_algos.trainer.loop import RLTrainer

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_validation_reports_paper_metrics_per_data_source(ray_cluster, raw_config, tmp_path):
    from rl_algos.data import write_rows

    rows = [
        {
            "prompt": [{"role": "user", "content": f"Say {word}"}],
            "data_source": source,
            "reward_model": {"style": "rule", "ground_truth": "0123456789"},
            "extra_info": {"index": i},
        }
        for i, (word, source) in enumerate(
            [("apple", "digits_a"), ("river", "digits_a"), ("cloud", "digits_b")]
        )
    ]
    val = write_rows(rows, tmp_path / "val.jsonl")
    raw = raw_config(tmp_path / "run", "dapo")  # the digit-fraction reward
    raw["data"]["val_files"] = [str(val)]
    config = load_config(
        raw,
        ["rollout.val_n=4", "rollout.val_temperature=1.0", "algorithm.overlong.buffer_length=4"],
    )
    assert config.algorithm.overlong.enabled  # DAPO's shaping is on for training
    trainer = RLTrainer(config)
    try:
        metrics = trainer.validate()
        # the same reward with the training-time shaping, on a fresh generation
        train_batch = trainer._generate_and_score(trainer._next_prompts(), 0, 0)
    finally:
        trainer.close()
    train_metrics = train_batch.meta_info["reward_metrics"]
    # an untrained model runs to max_response_length: the penalty is active in training...
    assert train_metrics["reward/overlong_penalty_mean"] < -0.5
    # ...but validation reports the task's score, a fraction of digits in [0, 1]
    assert 0.0 <= metrics["val/score"] <= 1.0
    assert metrics["val/response_length"] > 6
    for source in ("digits_a", "digits_b"):
        for key in ("accuracy", "score", "mean@4", "pass@1", "pass@2", "pass@4"):
            assert f"val/{source}/{key}" in metrics
    overall = (2 * metrics["val/digits_a/score"] + metrics["val/digits_b/score"]) / 3
    assert metrics["val/score"] == pytest.approx(overall)
    assert metrics["val/pass@1"] == pytest.approx(metrics["val/accuracy"])
    assert metrics["val/pass@1"] <= metrics["val/pass@2"] <= metrics["val/pass@4"]
    assert not any("maj@" in k for k in metrics)  # this reward gives no answers to vote on


def test_plain_split_is_generated_and_reported_beside_val_accuracy(
    ray_cluster, raw_config, tmp_path
):
    """data.generate.plain_test_size: a plain split (no system prompt, no demos, held-out
    phrasings) validated beside the test split as val/plain_*; each with a 95% interval."""
    from pathlib import Path

    from rl_algos.data import read_rows
    from rl_algos.validation import accuracy_interval

    raw = raw_config(tmp_path / "run", "grpo")
    raw["data"].pop("train_files"), raw["data"].pop("val_files")
    raw["data"]["max_prompt_length"] = 1024
    raw["data"]["generate"] = {
        "task": "arithmetic",
        "train_size": 16,
        "test_size": 6,
        "plain_test_size": 10,
        "options": {"max_value": 9, "few_shot": 1, "few_shot_min": 0, "system_prompt": "Calc."},
    }
    reward = Path(__file__).resolve().parents[2] / "examples" / "rewards" / "boxed_answer.py"
    raw["reward"]["function_path"] = str(reward)
    trainer = RLTrainer(load_config(raw))
    try:
        metrics = trainer.validate()
    finally:
        trainer.close()
    data = tmp_path / "run" / "data" / "arithmetic"
    plain = read_rows(data / "plain_test.parquet")
    assert trainer.config.data.extra_val_files == {"plain": [str(data / "plain_test.parquet")]}
    assert len(plain) == len(trainer.extra_val_sets["plain"]) == 10
    assert all(len(r["prompt"]) == 1 for r in plain)  # no system prompt, no demos
    for prefix in ("val/", "val/plain_"):
        for key in ("accuracy", "boxed", "boxed_share", "accuracy_ci95", "pass@1", "score"):
            assert f"{prefix}{key}" in metrics, f"{prefix}{key}"
        assert 0.0 <= metrics[f"{prefix}accuracy"] <= 1.0
    # the interval is that of 10 (plain) and 6 (test) greedy answers at these accuracies
    for prefix, count in (("val/", 6), ("val/plain_", 10)):
        right = round(metrics[f"{prefix}accuracy"] * count)
        flags = [True] * right + [False] * (count - right)
        assert metrics[f"{prefix}accuracy_ci95"] == pytest.approx(
            accuracy_interval(list(range(count)), flags)
        )
    assert "val/plain_arithmetic/accuracy" in metrics
    assert metrics["timing/validate_s"] > 0

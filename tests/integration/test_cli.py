"""The `rl` command as a user runs it: data generation, config errors, train, eval."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from rl_algos.trainer.tracking import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "examples" / "grpo_tiny.yaml")
RL = Path(sys.executable).with_name("rl")  # the console script of this environment


def rl(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    assert RL.is_file(), f"the rl console script is not installed next to {sys.executable}"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run(
        [str(RL), *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env
    )


def last_json(stdout: str) -> dict:
    """The JSON object the command prints last (after its console metric lines)."""
    start = stdout.rindex("\n{\n") + 1 if "\n{\n" in stdout else stdout.index("{")
    return json.loads(stdout[start:])


def test_rl_data_writes_parquet_splits(tmp_path):
    out = tmp_path / "arith"
    args = ["data", "arithmetic", "--out", str(out), "--train-size", "40", "--test-size", "10"]
    proc = rl(*args, "--max-value", "20", "--ops", "+", "-", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"-> {out / 'train.parquet'}" in proc.stdout
    train = pq.read_table(out / "train.parquet").to_pylist()
    test = pq.read_table(out / "test.parquet").to_pylist()
    assert len(train) == 40 and len(test) == 10
    for row in train + test:
        assert row["data_source"] == "arithmetic"
        assert row["prompt"][-1]["role"] == "user"
        expression = re.search(r"What is (.+)\?", row["prompt"][-1]["content"]).group(1)
        assert all(0 <= int(n) <= 20 for n in re.findall(r"\d+", expression))
        assert set(re.findall(r"[+*/-]", expression)) <= {"+", "-"}
        assert row["reward_model"]["ground_truth"] == str(eval(expression))  # independent
    # seeded: the same command writes the same rows, another seed other rows
    again = rl(*args, "--max-value", "20", "--ops", "+", "-", cwd=tmp_path, timeout=120)
    assert again.returncode == 0
    assert pq.read_table(out / "train.parquet").to_pylist() == train
    other = rl(*args, "--max-value", "20", "--seed", "1", cwd=tmp_path, timeout=120)
    assert other.returncode == 0
    assert pq.read_table(out / "train.parquet").to_pylist() != train


def test_bad_key_exits_2_with_the_key_path_and_a_suggestion(tmp_path):
    proc = rl(
        "train", TINY, "actor.optim.lrr=1", f"trainer.output_dir={tmp_path / 'out'}", cwd=tmp_path
    )
    assert proc.returncode == 2
    assert "actor.optim.lrr: unknown key 'lrr'; did you mean 'lr'?" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_bad_value_exits_2_with_the_allowed_values(tmp_path):
    proc = rl("train", TINY, "actor.loss.agg_mode=token_mean", cwd=tmp_path)
    assert proc.returncode == 2
    assert "actor.loss.agg_mode" in proc.stderr and "did you mean 'token-mean'?" in proc.stderr


@pytest.mark.parametrize(
    ("override", "key", "group"),
    [
        ("actor.engine=fdsp", "actor.engine", "rl.engines"),
        ("rollout.backend=hff", "rollout.backend", "rl.rollouts"),
    ],
)
def test_unknown_engine_or_rollout_fails_before_any_worker_starts(tmp_path, override, key, group):
    from rl_core.registry import Registry

    installed = Registry(group).names()
    assert installed
    out = tmp_path / "out"
    proc = rl("train", TINY, override, f"trainer.output_dir={out}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"rl train: config error: {key}: invalid value")
    assert f"({', '.join(installed)};" in line and "did you mean" in line
    assert "Ray" not in proc.stderr + proc.stdout  # nothing started
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.ray
def test_rl_train_then_rl_eval_of_its_checkpoint(tmp_path, raw_config):
    out = tmp_path / "run"
    config = raw_config(out, "grpo")
    config["trainer"].update(
        total_steps=6,
        save_every=6,
        val_every=6,
        val_before_train=True,
        loggers=["console", "jsonl"],
    )
    config_file = tmp_path / "digits.yaml"
    OmegaConf.save(OmegaConf.create(config), config_file)

    train = rl("train", str(config_file), cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-4000:]
    assert re.search(r"^step 6: score=", train.stdout, re.M)  # console logger
    summary = last_json(train.stdout)
    assert summary["output_dir"] == str(out)
    history = read_jsonl(out / "metrics.jsonl")
    assert [h["step"] for h in history] == list(range(7))
    first, final = history[0], history[-1]
    assert summary["val/score"] == final["val/score"]
    assert summary["val/accuracy_first"] == first["val/accuracy"]
    assert (out / "metrics.png").is_file()
    assert (out / "checkpoints" / "latest").read_text() == "step_6"

    evaluation = rl("eval", str(config_file), "trainer.resume=latest", cwd=tmp_path)
    assert evaluation.returncode == 0, evaluation.stderr[-4000:]
    metrics = last_json(evaluation.stdout)
    assert metrics["step"] == 6
    # greedy validation of the checkpoint: what the run measured after its last step,
    # and not what the initial model scored (the run learned: they differ)
    keys = ("val/accuracy", "val/score", "val/response_length")
    assert {k: metrics[k] for k in keys} == {k: final[k] for k in keys}
    assert {k: first[k] for k in keys} != {k: final[k] for k in keys}

    # the same command again, resuming: the run is complete, nothing to train or overwrite
    again = rl("train", str(config_file), "trainer.resume=latest", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "nothing to train: the run is at step 6 and trainer.total_steps=6" in again.stderr
    assert read_jsonl(out / "metrics.jsonl") == history

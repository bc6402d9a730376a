"""Mistakes in what the user gives `rl train` end in one line that names the field, the
value and what was expected, with exit status 2, before Ray or any worker starts; the
traceback only with ``--debug``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rl_algos.data import write_rows

RL = Path(sys.executable).with_name("rl")


def rl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run(
        [str(RL), *args], capture_output=True, text=True, cwd=cwd, timeout=300, env=env
    )


def _row(i: int, **changes) -> dict:
    row = {
        "prompt": [{"role": "user", "content": f"Say {i}"}],
        "data_source": "digits",
        "reward_model": {"style": "rule", "ground_truth": "0123456789"},
        "extra_info": {"index": i},
    }
    row.update(changes)
    return row


def _config_file(tmp_path: Path, raw: dict, rows: list[dict] | None = None) -> Path:
    if rows is not None:
        raw["data"]["train_files"] = [str(write_rows(rows, tmp_path / "train.jsonl"))]
    path = tmp_path / "run.yaml"
    OmegaConf.save(OmegaConf.create(raw), path)
    return path


def _corrupt_checkpoint(out: Path) -> str:
    """A checkpoint directory whose manifest lists a file that was truncated."""
    from rl_core.checkpoint import write_manifest

    step = out / "checkpoints" / "step_2"
    (step / "actor").mkdir(parents=True)
    (step / "actor" / "weights.distcp").write_bytes(b"x" * 1000)
    (step / "trainer_state.json").write_text("{}")
    write_manifest(step)
    (step / "actor" / "weights.distcp").write_bytes(b"x" * 10)
    return str(step)


CASES = {
    # (rows of the training file or None, overrides) -> the start of the message
    "missing ground truth": (
        [_row(0), _row(1, reward_model={"style": "rule"}), _row(2), _row(3)],
        [],
        "rl train: error: data.train_files row 1, column 'reward_model.ground_truth': missing",
    ),
    "data source without a reward function": (
        [_row(i, data_source="gsm8kk" if i == 1 else "gsm8k") for i in range(4)],
        ["reward.function_path=null"],
        "rl train: error: data.train_files row 1, column 'data_source': no reward function for "
        "data_source 'gsm8kk'; known data sources: ",
    ),
    "unknown tool": (
        None,
        ["rollout.tools={pythn: {}}"],
        "rl train: config error: rollout.tools.pythn: invalid value 'pythn'; expected an installed "
        "tool (",
    ),
    "corrupt resume checkpoint": (
        None,
        ["trainer.resume=CORRUPT"],
        "rl train: error: checkpoint CORRUPT: actor/weights.distcp: truncated or extended: "
        "10 bytes, expected 1000",
    ),
    "missing reward file": (
        None,
        ["reward.function_path=/nonexistent/reward.py"],
        "rl train: config error: reward.function_path: invalid value '/nonexistent/reward.py'; "
        "expected an existing Python file",
    ),
    "NaN error score": (
        None,
        ["reward.error_score=nan"],
        "rl train: config error: reward.error_score: invalid value 'nan'; expected a finite number",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_user_errors_are_one_line_exit_2_before_ray(case, tmp_path, raw_config, capsys):
    import ray

    from rl_algos.cli import main

    rows, overrides, expected = CASES[case]
    out = tmp_path / "out"
    if "trainer.resume=CORRUPT" in overrides:
        bad = _corrupt_checkpoint(out)
        overrides = [f"trainer.resume={bad}"]
        expected = expected.replace("CORRUPT", bad)
    config = _config_file(tmp_path, raw_config(out, "grpo"), rows)
    status = main(["train", str(config), *overrides])  # in process: no Ray may start
    err = capsys.readouterr().err
    assert status == 2, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("rl train:")]
    assert len(lines) == 1 and lines[0].startswith(expected), err[-3000:]
    assert "Traceback" not in err
    assert not ray.is_initialized()  # the check ran before any worker or Ray started


def test_debug_prints_the_traceback_with_the_same_status(tmp_path, raw_config):
    config = _config_file(
        tmp_path, raw_config(tmp_path / "out", "grpo"), [_row(0), _row(1, reward_model={})]
    )
    debug = rl("--debug", "train", str(config), cwd=tmp_path)
    assert debug.returncode == 2
    assert "Traceback (most recent call last)" in debug.stderr and "DataError" in debug.stderr
    assert (
        debug.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "rl train: error: data.train_files row 1, column 'reward_model.ground_truth': missing"
        )
    )
    assert "Started a local Ray instance" not in debug.stderr + debug.stdout


def test_changed_generate_options_regenerate_the_data_or_stop_a_resume(tmp_path):
    from rl_algos.config import ConfigError, load_config
    from rl_algos.trainer.run_setup import materialize_generated_task

    def config(max_value: int, resume: str | None = None):
        raw = {
            "model": {"path": "tiny-random:qwen2"},
            "data": {
                "generate": {
                    "task": "arithmetic",
                    "train_size": 20,
                    "test_size": 4,
                    "options": {"max_value": max_value, "ops": ["+"]},
                }
            },
            "trainer": {"output_dir": str(tmp_path), "resume": resume},
        }
        return load_config(raw)

    import pyarrow.parquet as pq

    def largest_operand() -> int:
        rows = pq.read_table(tmp_path / "data" / "arithmetic" / "train.parquet").to_pylist()
        import re

        return max(int(n) for r in rows for n in re.findall(r"\d+", r["prompt"][-1]["content"]))

    materialize_generated_task(config(9), tmp_path)
    record = json.loads((tmp_path / "data" / "arithmetic" / "generate.json").read_text())
    assert record["options"] == {"max_value": 9, "ops": ["+"]}
    assert largest_operand() <= 9
    materialize_generated_task(config(500), tmp_path)  # changed: regenerated
    assert largest_operand() > 9
    assert (
        json.loads((tmp_path / "data" / "arithmetic" / "generate.json").read_text())["options"][
            "max_value"
        ]
        == 500
    )
    with pytest.raises(
        ConfigError, match=r"data\.generate\.options: changed since the run started"
    ):
        materialize_generated_task(config(9, resume="latest"), tmp_path)
    materialize_generated_task(config(500, resume="latest"), tmp_path)  # same: fine

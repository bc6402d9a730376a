"""`rl train examples/grpo_tiny_rollout_correction.yaml`: a bf16 rollout against the fp32
trainer, corrected with truncated IS, geometric-level rejection and the veto; and the
one-line refusal of a rejection that cannot get the old log-probs."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_algos.trainer.tracking import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "grpo_tiny_rollout_correction.yaml")
RL = Path(sys.executable).with_name("rl")


def rl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run(
        [str(RL), *args], capture_output=True, text=True, cwd=cwd, timeout=600, env=env
    )


def test_the_example_trains_and_logs_verl_rollout_correction_metrics(tmp_path):
    # bounds of 1e-4 nats on the geometric-mean ratio: bf16 rounding leaves some sequences
    proc = rl("train", EXAMPLE, f"trainer.output_dir={tmp_path / 'out'}",
              "actor.loss.rollout_correction.rollout_rs_threshold=0.9999_1.0001", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [r for r in read_jsonl(tmp_path / "out" / "metrics.jsonl") if "timing/step_s" in r]
    assert len(steps) == 2
    for row in steps:
        assert math.isfinite(row["actor/pg_loss"])
        # the mismatch is real (bf16 vs fp32) and small: weights near 1, none truncated
        assert row["rollout_corr/rollout_is_max"] != row["rollout_corr/rollout_is_min"]
        assert row["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=0.05)
        assert row["rollout_corr/rollout_is_ratio_fraction_high"] == 0.0
        assert row["rollout_corr/kl"] != 0.0 and abs(row["rollout_corr/kl"]) < 0.05
        # a sequence is rejected exactly when its geometric-mean ratio leaves the bounds
        p = "rollout_corr/rollout_rs_seq_mean_k1"
        outside = row[f"{p}_seq_fraction_high"] + row[f"{p}_seq_fraction_low"]
        assert row[f"{p}_seq_masked_fraction"] == pytest.approx(outside)
        assert row["rollout_corr/rollout_is_veto_fraction"] == 0.0  # no ratio under 1e-4
    assert any(row["rollout_corr/rollout_rs_masked_fraction"] > 0 for row in steps)


def test_rejection_without_old_log_probs_is_refused_with_one_line(tmp_path):
    proc = rl("train", EXAMPLE, "actor.recompute_old_log_probs=false", cwd=tmp_path)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if "actor.recompute_old_log_probs" in line]
    assert len(lines) == 1 and "rejection needs the old log-probs" in lines[0]
    assert "Traceback" not in proc.stderr

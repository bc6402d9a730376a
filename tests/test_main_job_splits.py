"""The main job's validation splits stay the same, row for row, whatever its training side
does (curriculum, sampling): `val/accuracy` and `val/plain_accuracy` of runs before and after
a change compare the same questions. The fingerprints below are of the splits the job
wrote on 2026-11-27 (issue #32's runs, docs/results/main-job-seeds)."""

from __future__ import annotations

import collections
import hashlib
import json
from pathlib import Path

import pytest

from rl_algos.config import load_config
from rl_algos.data import read_rows
from rl_algos.trainer.run_setup import materialize_generated_task

JOB = Path(__file__).parents[1] / "examples" / "grpo_smollm2_arithmetic.yaml"
# sha256 of the JSON list of (prompt, ground truth), in file order
FINGERPRINTS = {
    "test": "8a396090d38e01faf6c5e39580ea54e002ba5e2257abd646e8ba8e4b93d9c414",
    "plain_test": "224fd93e7b408f7b6176fe1400d164760e0df33469596914cc4e2266c0a76118",
}


def _fingerprint(rows: list[dict]) -> str:
    pairs = [[row["prompt"], row["reward_model"]["ground_truth"]] for row in rows]
    return hashlib.sha256(json.dumps(pairs, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("train_repeats", [False, True])
def test_the_main_jobs_validation_splits_are_unchanged(tmp_path, train_repeats):
    overrides = [f"trainer.output_dir={tmp_path}", f"data.generate.train_repeats={train_repeats}"]
    cfg = load_config(str(JOB), overrides)
    materialize_generated_task(cfg, tmp_path)
    data = tmp_path / "data" / "arithmetic"
    splits = {name: read_rows(data / f"{name}.parquet") for name in FINGERPRINTS}
    assert {name: len(rows) for name, rows in splits.items()} == {"test": 100, "plain_test": 200}
    assert {name: _fingerprint(rows) for name, rows in splits.items()} == FINGERPRINTS
    # the kinds the per-kind tables report (docs/results/main-job-seeds/by-kind-*-plain.md)
    kinds = collections.Counter(row["kind"] for row in splits["plain_test"])
    assert kinds["ab*c"] == 29
    assert kinds["a-cd<0"] + kinds["ab-cd<0"] + kinds["a-c<0"] == 23 + 4 + 9

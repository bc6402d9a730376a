"""The `shapes` task: the ground truth is the colour that covers most pixels (counted here
from the decoded image), the reward follows its rules, and it is registered by name."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from PIL import Image

from rl_algos.data.tasks import task_factory
from rl_algos.rewards import REWARDS
from rl_multimodal.vlm.shapes import COLOURS, ShapesTask, compute_score


def test_ground_truth_is_the_colour_with_most_pixels():
    task, rng = ShapesTask(), random.Random(0)
    seen = set()
    for _ in range(60):
        _, row = task.sample(rng)
        pixels = np.asarray(Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB"))
        counts = {k: int((pixels == np.array(c)).all(-1).sum()) for k, c in COLOURS.items()}
        truth = row["reward_model"]["ground_truth"]
        assert truth == max(counts, key=counts.get)
        assert counts[truth] >= 2 * max(v for k, v in counts.items() if k != truth)
        assert row["prompt"][-1]["content"].count("<image>") == 1
        seen.add(truth)
    assert seen == set(COLOURS)  # every answer occurs


@pytest.mark.parametrize(
    "response, truth, score, acc",
    [("r", "r", 1.0, 1.0), (" G<|im_end|>", "g", 1.0, 1.0), ("b", "r", 0.1, 0.0),
     ("x", "r", 0.0, 0.0), ("", "b", 0.0, 0.0), ("red", "r", 1.0, 1.0)],
)  # fmt: skip
def test_reward(response, truth, score, acc):
    assert compute_score("shapes", response, truth) == {"score": score, "acc": acc}


def test_bad_ground_truth_is_rejected():
    with pytest.raises(ValueError, match="ground_truth='purple'"):
        compute_score("shapes", "r", "purple")


def test_registered_as_task_and_reward():
    assert task_factory("shapes") is ShapesTask
    assert REWARDS.get("shapes") is compute_score


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="min_big"):
        ShapesTask(min_big=0.9, max_big=0.5)

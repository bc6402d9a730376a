"""The async rollout buffer's staleness bound, its metrics and its checkpoint format."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from rl_algos.trainer.async_rollout import (
    AsyncRolloutBuffer,
    load_batches,
    save_batches,
    staleness_metrics,
)
from rl_core.protocol import DataProto


class Trainer:
    """A trainer whose step counter moves when the test says so."""

    def __init__(self) -> None:
        self.step = 0
        self.started_at: dict[int, int] = {}  # batch index -> trainer step when it started

    def produce(self, index: int) -> DataProto:
        self.started_at[index] = self.step
        time.sleep(0.01)
        return DataProto.from_dict({"x": torch.tensor([index])}, meta_info={"index": index})


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_a_batch_starts_only_within_the_staleness_bound(max_staleness):
    trainer = Trainer()
    buffer = AsyncRolloutBuffer(trainer.produce, lambda: trainer.step, max_staleness)
    try:
        for step in range(6):
            batch = buffer.get()
            assert batch.meta_info["index"] == step  # in order
            time.sleep(0.1)  # "training": the producer runs ahead as far as it may
            assert max(trainer.started_at) == step + max_staleness
            trainer.step += 1
            buffer.version_changed()
        # every batch k started at a trainer step >= k - max_staleness, and ran ahead fully
        for index, step in trainer.started_at.items():
            assert index - max_staleness <= step
        assert all(trainer.started_at[k] == max(0, k - max_staleness) for k in range(6))
    finally:
        buffer.close()


def test_producer_errors_reach_the_trainer_and_pause_waits_for_the_running_batch():
    started = threading.Event()
    release = threading.Event()

    def produce(index: int) -> DataProto:
        if index == 1:
            started.set()
            release.wait(5)
            raise RuntimeError("reward worker died")
        return DataProto.from_dict({"x": torch.tensor([index])})

    buffer = AsyncRolloutBuffer(produce, lambda: 0, 1)
    try:
        assert buffer.get().batch["x"].tolist() == [0]
        assert started.wait(5)
        threading.Timer(0.3, release.set).start()
        begin = time.perf_counter()
        with buffer.paused() as pending:  # waits for batch 1 to end (here: fail)
            assert time.perf_counter() - begin >= 0.25 and pending == []
        with pytest.raises(RuntimeError, match="reward worker died"):
            buffer.get()
    finally:
        buffer.close()
    with pytest.raises(ValueError, match="max_staleness=0"):
        AsyncRolloutBuffer(produce, lambda: 0, 0)


def test_staleness_metrics_against_hand_computation():
    # 4 rows trained at version 3: oldest token versions 3, 2, 2 (partial: 2 then 3), none
    versions = torch.tensor([[3, 3, -1], [2, 2, 2], [2, 3, 3], [-1, -1, -1]])
    mask = (versions >= 0).long()
    rollout = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, -1.0, -1.0], [-0.5, -1.0, -1.0], [0.0] * 3])
    old = rollout + torch.tensor([[0.0, 0.1, 0.0], [-0.2, 0.0, 0.0], [0.3, 0.0, 0.0], [0.0] * 3])
    batch = DataProto.from_dict(
        {
            "rollout_weight_versions": versions,
            "policy_version": torch.tensor([3, 2, 2, -1]),
            "response_mask": mask,
            "rollout_log_probs": rollout,
            "old_log_probs": old,
        },
        meta_info={"rollout_version": 1},  # the row without policy tokens counts as 1
    )
    m = staleness_metrics(batch, version=3, max_staleness=2)
    assert m["async/staleness/max"] == 2.0
    assert m["async/staleness/mean"] == pytest.approx((0 + 1 + 1 + 2) / 4)
    assert [m[f"async/staleness/hist_{k}"] for k in range(3)] == [0.25, 0.5, 0.25]
    assert m["async/partial_rollout_frac"] == 0.25
    ratios = np.exp([0.0, 0.1, -0.2, 0.0, 0.0, 0.3, 0.0, 0.0])
    assert m["async/importance_ratio/mean"] == pytest.approx(ratios.mean())
    assert m["async/importance_ratio/max"] == pytest.approx(ratios.max())
    assert m["async/importance_ratio/min"] == pytest.approx(ratios.min())
    with pytest.raises(RuntimeError, match=r"staleness 2 > async\.max_staleness=1"):
        staleness_metrics(batch, version=3, max_staleness=1)


def test_untrained_batches_round_trip_without_pickle(tmp_path):
    batch = DataProto.from_dict(
        {"responses": torch.arange(6).reshape(2, 3), "policy_version": torch.tensor([4, 5])},
        {
            "uid": np.array(["a", "b"], dtype=object),
            "reward_model": np.array([{"ground_truth": "7"}, {"ground_truth": "9"}], dtype=object),
            "raw_prompt_ids": np.array([[1, 2], [3]], dtype=object),
            "num_turns": np.array([1, 2], dtype=np.int64),
        },
        {"rollout_version": 4, "loader_state": {"epoch": 0, "position": 8}},
    )
    save_batches([batch, batch[1:]], tmp_path / "buf")
    back = load_batches(tmp_path / "buf")
    assert len(back) == 2 and len(back[1]) == 1
    assert torch.equal(back[0].batch["responses"], batch.batch["responses"])
    assert back[0].non_tensor_batch["reward_model"][1] == {"ground_truth": "9"}
    assert back[0].non_tensor_batch["raw_prompt_ids"][0] == [1, 2]
    assert back[0].non_tensor_batch["num_turns"].tolist() == [1, 2]
    assert back[0].meta_info == batch.meta_info
    assert load_batches(tmp_path / "nothing") == []

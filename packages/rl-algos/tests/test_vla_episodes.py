"""Rows that are the steps of episodes (VLA runs): advantages over whole episodes, checked
by hand, and the episode source's batch layout and failure accounting (a fake env group)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_algos.advantages import compute_advantage
from rl_core.protocol import DataProto


def _step_rows(episodes, steps, rewards, uids, width=2):
    """One row per (episode, step); the step's reward on the row's last token."""
    n = len(episodes)
    scores = torch.zeros(n, width)
    scores[:, -1] = torch.tensor(rewards, dtype=torch.float32)
    return DataProto.from_dict(
        {"token_level_rewards": scores, "response_mask": torch.ones(n, width)},
        {
            "episode_index": np.array(episodes, dtype=object),
            "episode_step": np.array(steps, dtype=object),
            "uid": np.array(uids, dtype=object),
        },
    )


def test_grpo_over_episodes_matches_a_hand_computation():
    # group a: episode 0 (3 steps, return 1), episode 1 (2 steps, return 0)
    # group b: episode 2 (1 step, return 1), episode 3 (2 steps, return 0.5)
    rows = [(0, 0, 0.0), (0, 1, 0.0), (0, 2, 1.0), (1, 0, 0.0), (1, 1, 0.0),
            (2, 0, 1.0), (3, 0, 0.25), (3, 1, 0.25)]  # fmt: skip
    uids = ["a"] * 5 + ["b"] * 3
    order = np.random.default_rng(0).permutation(len(rows))  # rows in any order
    batch = _step_rows(*[[rows[i][k] for i in order] for k in range(3)], [uids[i] for i in order])
    compute_advantage(batch, "grpo", norm_adv_by_std_in_grpo=True)
    # by hand: per group, (return - mean) / (unbiased std + 1e-6), the same for every step
    std_a = np.std([1.0, 0.0], ddof=1)
    std_b = np.std([1.0, 0.5], ddof=1)
    per_episode = {
        0: (1.0 - 0.5) / (std_a + 1e-6),
        1: (0.0 - 0.5) / (std_a + 1e-6),
        2: (1.0 - 0.75) / (std_b + 1e-6),
        3: (0.5 - 0.75) / (std_b + 1e-6),
    }
    expected = torch.tensor([[per_episode[rows[i][0]]] * 2 for i in order], dtype=torch.float32)
    torch.testing.assert_close(batch.batch["advantages"], expected, rtol=1e-6, atol=1e-6)


def test_reinforce_plus_plus_over_episodes_discounts_later_steps():
    """Per-step returns within an episode: step t's return is the discounted sum of the
    episode's rewards from t on (gamma 0.5 here), then whitened over the batch's steps."""
    batch = _step_rows([0, 0, 0, 1], [0, 1, 2, 0], [1.0, 0.0, 2.0, 1.0], ["a", "a", "a", "b"])
    compute_advantage(batch, "reinforce_plus_plus", gamma=0.5)
    returns = np.array([1.0 + 0.5 * 0.0 + 0.25 * 2.0, 0.0 + 0.5 * 2.0, 2.0, 1.0])
    got = batch.batch["advantages"][:, -1].numpy()
    # whitening keeps the order and the differences' ratios of the per-step returns
    ratio = (got[0] - got[1]) / (returns[0] - returns[1])
    np.testing.assert_allclose(got - got.mean(), ratio * (returns - returns.mean()), atol=1e-5)
    assert ratio > 0


class _FakeEnvGroup:
    """Two halves of 2 envs; half 1's `wait` fails once (a hung or lost worker)."""

    def __init__(self, fail_with: Exception | None) -> None:
        self.fail_with, self.restarted, self.pending = fail_with, [], {}

    def rows(self, n):
        return [np.arange(0, n // 2), np.arange(n // 2, n)]

    def reset_async(self, half, key, seeds):
        self.pending[half] = ("reset", len(seeds))

    def step_async(self, half, key, actions):
        self.pending[half] = ("step", len(actions))

    def wait(self, half):
        from rl_core.env import EnvObservation, EnvStep

        kind, n = self.pending.pop(half)
        if half == 1 and kind == "step" and self.fail_with is not None:
            error, self.fail_with = self.fail_with, None
            raise error
        obs = EnvObservation(np.zeros((n, 4, 4, 3), np.uint8), np.zeros((n, 0)), ["go"] * n)
        if kind == "reset":
            return obs
        done = np.ones(n, bool)
        return EnvStep(obs, np.ones(n, np.float32), done, ~done, {"success": done})

    def restart(self, half):
        self.restarted.append(half)


class _FakeRollout:
    version = 3

    def generate_sequences(self, batch):
        n = len(batch)
        return DataProto.from_dict(
            {
                "env_actions": torch.zeros(n, 2),
                "prompt_ids": torch.ones(n, 3, dtype=torch.long),
                "prompt_mask": torch.ones(n, 3, dtype=torch.long),
                "log_probs": torch.full((n, 2), -0.5),
                "values": torch.zeros(n),
                "action_tokens": torch.full((n, 2), 7, dtype=torch.long),
            }
        )


def _source(fraction: float):
    from types import SimpleNamespace

    from rl_algos.trainer.vla_episodes import VLAEpisodeSource

    source = VLAEpisodeSource.__new__(VLAEpisodeSource)
    vla = SimpleNamespace(groups=2, max_steps=2, val_episodes=0)
    source.cfg = SimpleNamespace(
        vla=vla,
        rollout=SimpleNamespace(n=2),
        trainer=SimpleNamespace(seed=0),
        env=SimpleNamespace(name="fake", max_failure_fraction=fraction),
    )
    source.vla, source.pad_id, source.index = vla, 0, 0
    return source


@pytest.mark.parametrize("error", ["died", "timeout"])
def test_a_failed_half_is_dropped_counted_and_restarted(error):
    from rl_algos.trainer.env_episodes import EnvFailureBoundError
    from rl_core.single_controller import WorkerDiedError, WorkerTimeoutError

    fail = (
        WorkerDiedError("env1", 0, "step", "killed")
        if error == "died"
        else WorkerTimeoutError("env1", "step", [0], 8.0)
    )
    source = _source(0.5)
    source.envs = _FakeEnvGroup(fail)
    batch, metrics = source.play(_FakeRollout(), 0)
    assert source.envs.restarted == [1]
    assert metrics["env/episodes"] == 4 and metrics["env/failed_episodes"] == 2
    assert sorted(set(batch.non_tensor_batch["episode_index"])) == [0, 1]  # half 0's only
    assert batch.meta_info["rollout_version"] == 3 and metrics["train/success_rate"] == 1.0
    torch.testing.assert_close(batch.batch["token_level_scores"][:, -1], torch.ones(2))
    assert batch.batch["input_ids"].shape == (2, 5)  # prompt 3 + 2 action tokens
    # over the bound (half the episodes failed, 0.25 allowed): the run stops, naming why
    source = _source(0.25)
    source.envs = _FakeEnvGroup(fail)
    with pytest.raises(EnvFailureBoundError, match="2 of 4 episodes failed"):
        source.play(_FakeRollout(), 0)


def test_cpu_plan_counts_one_vla_env_group_per_node():
    """VLA env workers are ``env.num_workers`` per node (not per training worker, as text
    env pools are): 2 training workers x 1 CPU + 2 env workers x 0.5 fit 3 CPUs."""
    from pathlib import Path

    from rl_algos.config import VLA_ENVS, load_config
    from rl_algos.trainer.cpu_plan import plan_cpus

    if "reach" not in VLA_ENVS.names():
        pytest.skip("needs rl-multimodal (the reach env)")
    example = Path(__file__).resolve().parents[3] / "examples" / "grpo_vla_reach.yaml"
    cfg = load_config(str(example), ["trainer.num_workers=2", "trainer.ray_num_cpus=3"])
    plan = plan_cpus(cfg, 3.0)
    assert (plan.env_workers, plan.env_cpus, plan.trainer_cpus_per_worker) == (2, 1.0, 1.0)

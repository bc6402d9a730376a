"""The environment contract: the built-in reach task, the Gymnasium adapter."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_core.env import ActionSpec, EnvObservation, VectorEnv, check_action_chunk
from rl_multimodal.vla.envs import GymnasiumVectorEnv, ReachConfig, ReachEnv

gymnasium = pytest.importorskip("gymnasium")


def test_check_action_chunk_errors_name_the_field():
    spec = ActionSpec([-1, -1], [1, 1], max_chunk=2)
    assert check_action_chunk(np.zeros((3, 2)), spec, 3).shape == (3, 1, 2)
    with pytest.raises(ValueError, match=r"actions: shape \(3, 1, 5\), expected \[3, chunk, 2\]"):
        check_action_chunk(np.zeros((3, 1, 5)), spec, 3)
    with pytest.raises(ValueError, match=r"chunk length 3, expected 1\.\.2"):
        check_action_chunk(np.zeros((3, 3, 2)), spec, 3)
    with pytest.raises(ValueError, match="NaN"):
        check_action_chunk(np.full((3, 1, 2), np.nan), spec, 3)
    with pytest.raises(ValueError, match=r"low .* high"):
        ActionSpec([1.0], [0.0])
    with pytest.raises(ValueError, match="images"):
        EnvObservation(np.zeros((2, 4, 4, 3), np.float32), np.zeros((2, 0)), ["a", "b"])


def test_reach_episode_rewards_and_absorbing_state():
    cfg = ReachConfig(
        n_directions=4, distance=0.3, radius=0.12, step_size=0.15, max_steps=3, progress_reward=1.0
    )
    env = ReachEnv(2, cfg)
    assert isinstance(env, VectorEnv)
    obs = env.reset([0, 0])
    np.testing.assert_array_equal(obs.images[0], obs.images[1])  # same seed, same frame
    assert obs.images.shape == (2, cfg.image_size, cfg.image_size, 3)
    direction = (env.target[0] - 0.5) / 0.3  # a unit axis vector (4 directions)
    toward = np.stack([direction, np.zeros(2)])  # env 0 walks to the target, env 1 stays
    step = env.step(toward[:, None, :])
    # hand computation: distance 0.3 -> 0.15 for env 0 (reward 0.15), env 1 unchanged
    np.testing.assert_allclose(step.reward, [0.15, 0.0], atol=1e-6)
    assert not step.done.any()
    step = env.step(toward[:, None, :])
    np.testing.assert_allclose(step.reward, [0.15 + 1.0, 0.0], atol=1e-6)  # 0.15 -> 0.0, hit
    assert step.terminated.tolist() == [True, False] and step.info["success"].tolist() == [
        True,
        False,
    ]
    before = step.observation.images[0].copy()
    step = env.step(np.ones((2, 1, 2)))  # env 0 is absorbing; env 1 hits max_steps
    assert step.reward[0] == 0.0 and step.terminated[0]
    np.testing.assert_array_equal(step.observation.images[0], before)
    assert step.truncated.tolist() == [False, True] and step.info["success"].tolist() == [
        True,
        False,
    ]


def test_reach_chunk_stops_at_success():
    env = ReachEnv(1, ReachConfig(n_directions=4, max_steps=6, max_chunk=4, progress_reward=1.0))
    env.reset([3])
    d = (env.target[0] - 0.5) / 0.3
    step = env.step(np.tile(d, (1, 4, 1)))  # 4 moves, success after the 2nd
    assert env.steps[0] == 2 and step.terminated[0] and step.info["success"][0]
    np.testing.assert_allclose(step.reward, [0.3 + 1.0], atol=1e-6)


def test_reach_default_reward_does_not_make_standing_still_the_best_failure():
    """The bug behind the reach task's collapse, by hand: with distance shaping, a group of
    failed episodes ranks standing still above moving, so GRPO teaches "stand still"."""
    from rl_algos.advantages import compute_grpo_outcome_advantage

    def group_returns(progress_reward: float) -> np.ndarray:
        cfg = ReachConfig(n_directions=4, max_steps=2, progress_reward=progress_reward)
        env = ReachEnv(3, cfg)
        env.reset([5, 5, 5])
        d = (env.target[0] - 0.5) / 0.3  # unit vector to the target
        side = np.array([-d[1], d[0]])  # orthogonal: moves, never arrives
        actions = np.stack([np.zeros(2), side, -d])  # stay, sideways, away
        total = np.zeros(3)
        for _ in range(2):
            total += env.step(actions[:, None, :]).reward
        assert not env.success.any()
        return total

    shaped = group_returns(1.0)
    # hand computation: stay 0; sideways 0.3 -> hypot(0.3, 0.3) = -0.1243; away 0.3 -> 0.6
    np.testing.assert_allclose(shaped, [0.0, 0.3 - np.hypot(0.3, 0.3), -0.3], atol=1e-6)
    adv, _ = compute_grpo_outcome_advantage(
        token_level_rewards=torch.as_tensor(shaped[:, None]),
        response_mask=torch.ones(3, 1),
        index=np.zeros(3, np.int64),
    )
    assert adv[0, 0] > 0 > adv[2, 0]  # standing still is reinforced
    sparse = group_returns(0.0)  # the default: 1 on success, nothing else
    np.testing.assert_array_equal(sparse, [0.0, 0.0, 0.0])
    adv, _ = compute_grpo_outcome_advantage(
        token_level_rewards=torch.as_tensor(sparse[:, None]),
        response_mask=torch.ones(3, 1),
        index=np.zeros(3, np.int64),
    )
    np.testing.assert_array_equal(adv.numpy(), np.zeros((3, 1)))  # nothing is reinforced
    with pytest.raises(ValueError, match="progress_reward"):
        ReachConfig(progress_reward=-1.0)


def _pendulum(n: int | None = None):
    return gymnasium.make("Pendulum-v1", render_mode="rgb_array")


@pytest.mark.sim  # Pendulum renders with pygame (the `sim` extra's session has it)
def test_gymnasium_adapter_single_envs_match_direct_stepping():
    adapter = GymnasiumVectorEnv([_pendulum, _pendulum], instruction="swing up", image_size=64)
    ref = _pendulum()
    obs = adapter.reset([11, 12])
    ref_obs, _ = ref.reset(seed=11)
    assert obs.images.shape == (2, 64, 64, 3) and obs.images.dtype == np.uint8
    np.testing.assert_allclose(obs.proprio[0], ref_obs, rtol=1e-6)
    assert obs.instructions == ["swing up", "swing up"]
    chunk = np.array([[[0.5], [-1.0], [2.0]], [[0.0], [0.0], [0.0]]], np.float32)
    step = adapter.step(chunk)
    want = sum(ref.step(a)[1] for a in chunk[0])
    np.testing.assert_allclose(step.reward[0], want, rtol=1e-5)
    assert not step.done.any() and step.info["success"].tolist() == [False, False]
    assert adapter.action_spec.action_dim == 1
    adapter.close()


@pytest.mark.sim  # Pendulum renders with pygame (the `sim` extra's session has it)
def test_gymnasium_adapter_vector_env_and_truncation():
    vec = gymnasium.vector.SyncVectorEnv(
        [lambda: gymnasium.make("Pendulum-v1", render_mode="rgb_array", max_episode_steps=3)] * 2
    )
    adapter = GymnasiumVectorEnv(vec, image_size=32, max_chunk=2)
    obs = adapter.reset([1, 2])
    assert obs.images.shape == (2, 32, 32, 3) and obs.instructions[0] == "solve the task"
    step = adapter.step(np.zeros((2, 2, 1)))
    assert not step.done.any()
    step = adapter.step(np.zeros((2, 2, 1)))  # step 3 truncates; the 4th action is not run
    assert step.truncated.all() and not step.terminated.any()
    last = step.observation.images.copy()
    step = adapter.step(np.zeros((2, 1, 1)))  # absorbing: the auto-reset is never seen
    np.testing.assert_array_equal(step.observation.images, last)
    np.testing.assert_array_equal(step.reward, [0.0, 0.0])
    adapter.close()

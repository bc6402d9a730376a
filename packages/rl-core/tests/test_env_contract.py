"""rl_core.env: the environment contract's data types validate and name what is wrong."""

from __future__ import annotations

import numpy as np
import pytest

from rl_core.env import (
    ActionSpec,
    EnvObservation,
    EnvStep,
    VectorEnv,
    check_action_chunk,
    concat_observations,
)


def _obs(n: int, p: int = 2) -> EnvObservation:
    return EnvObservation(np.zeros((n, 4, 4, 3), np.uint8), np.zeros((n, p)), ["go"] * n)


def test_observation_and_step_validation():
    obs = _obs(3)
    assert obs.proprio.dtype == np.float32 and len(obs) == 3
    assert EnvObservation(
        np.zeros((2, 4, 4, 3), np.uint8), np.zeros(0), ["a", "b"]
    ).proprio.shape == (2, 0)
    with pytest.raises(ValueError, match=r"instructions: 2 strings, expected 3"):
        EnvObservation(np.zeros((3, 4, 4, 3), np.uint8), np.zeros((3, 1)), ["a", "b"])
    with pytest.raises(ValueError, match=r"proprio: shape \(2, 1\), expected \[3, P\]"):
        EnvObservation(np.zeros((3, 4, 4, 3), np.uint8), np.zeros((2, 1)), ["a"] * 3)
    with pytest.raises(ValueError, match="no 'success' entry"):
        EnvStep(obs, [0, 0, 0], [False] * 3, [False] * 3, {})
    with pytest.raises(ValueError, match=r"EnvStep.reward: 2 values, expected 3"):
        EnvStep(obs, [0, 0], [False] * 3, [False] * 3, {"success": [0, 0, 0]})
    step = EnvStep(
        obs, [1, 2, 3], [True, False, False], [False, False, True], {"success": [1, 0, 0]}
    )
    assert step.done.tolist() == [True, False, True]
    assert step.info["success"].dtype == bool and step.reward.dtype == np.float32


def test_action_chunks_select_and_concat():
    spec = ActionSpec([-1, 0], [1, 2], max_chunk=3)
    assert spec.action_dim == 2
    assert check_action_chunk([[0.5, 1.0]], spec, 1).shape == (1, 1, 2)
    with pytest.raises(ValueError, match=r"chunk length 4, expected 1\.\.3"):
        check_action_chunk(np.zeros((1, 4, 2)), spec, 1)
    with pytest.raises(ValueError, match="max_chunk is 0"):
        ActionSpec([0], [1], max_chunk=0)
    a, b = _obs(2), _obs(1)
    b.images[:] = 7
    both = concat_observations([a, b])
    assert len(both) == 3 and both.images[2].max() == 7 and both.select([2, 0]).images[0].max() == 7


def test_protocol_is_structural():
    class Tiny:
        num_envs = 1
        action_spec = ActionSpec([0], [1])

        def reset(self, seeds):
            return _obs(1)

        def step(self, actions):
            return EnvStep(_obs(1), [0], [False], [False], {"success": [False]})

        def close(self):
            pass

    assert isinstance(Tiny(), VectorEnv)
    assert not isinstance(object(), VectorEnv)

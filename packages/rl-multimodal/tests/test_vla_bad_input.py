"""Bad input to a VLA run is refused with one line naming what is wrong: an environment
returning the wrong observation shape, an action space the action tokenizer cannot cover,
too few usable tokens for the bins."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rl_algos.cli import main
from rl_algos.config import VLA_ENVS
from rl_multimodal.vla.envs import ReachConfig, ReachEnv

EXAMPLE = Path(__file__).parents[3] / "examples" / "grpo_vla_reach.yaml"
gymnasium = pytest.importorskip("gymnasium")


class ShrinkingReach(ReachEnv):
    """Reach whose step returns images of another size than reset's."""

    def step(self, actions):
        result = super().step(actions)
        obs = result.observation
        obs.images = np.ascontiguousarray(obs.images[:, ::2, ::2])
        return result


class Unbounded(gymnasium.Env):
    """A Gymnasium env whose actions are unbounded: no bins can cover them."""

    observation_space = gymnasium.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    action_space = gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        return np.zeros((8, 8, 3), np.uint8), {}

    def step(self, action):
        return np.zeros((8, 8, 3), np.uint8), 0.0, False, False, {}


def _unbounded(num_envs: int):
    from rl_multimodal.vla.envs import GymnasiumVectorEnv

    return GymnasiumVectorEnv([Unbounded() for _ in range(num_envs)], instruction="move")


@pytest.fixture(autouse=True)
def test_envs():
    VLA_ENVS.register("shrinking_reach", lambda n, **o: ShrinkingReach(n, ReachConfig(**o)))
    VLA_ENVS.register("unbounded", lambda n, **o: _unbounded(n))
    yield
    VLA_ENVS.unregister("shrinking_reach")
    VLA_ENVS.unregister("unbounded")


def _refused(capsys, tmp_path, *overrides: str) -> str:
    code = main(["train", str(EXAMPLE), "trainer.backend=local", f"trainer.output_dir={tmp_path}",
                 "trainer.total_steps=1", "vla.groups=1", "rollout.n=2", "vla.val_episodes=2",
                 "trainer.val_before_train=false", "trainer.val_every=0", "trainer.save_every=0",
                 "vla.frames=false", "env.options.image_size=32", *overrides])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    lines = [x for x in err if x.startswith("rl train:")]
    assert code == 2 and len(lines) == 1, err
    return lines[0]


def test_wrong_observation_shape_is_one_line(capsys, tmp_path):
    line = _refused(capsys, tmp_path, "env.name=shrinking_reach")
    assert "env 'shrinking_reach' (env worker 0)" in line
    assert "shape (1, 16, 16, 3)" in line and "expected uint8 [1, 32, 32, 3]" in line, line


def test_action_space_the_tokenizer_cannot_cover_is_one_line(capsys, tmp_path):
    line = _refused(capsys, tmp_path, "env.name=unbounded", "env.options={}")
    assert "env 'unbounded'" in line and "finite low < high" in line, line


def test_too_few_usable_tokens_for_the_bins_is_one_line(capsys, tmp_path):
    line = _refused(capsys, tmp_path, "vla.n_bins=100000")
    assert "vla.n_bins is 100000, expected <= 96" in line, line

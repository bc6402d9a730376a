"""The README's "plug in your own Gymnasium environment" example runs as written.

The code block is taken from packages/rl-multimodal/README.md and executed; its factory is
registered as a VLA environment and `rl train` (local backend) trains one step on it.
``MyEnv-v0`` is registered here as a small rendered 2-D point env.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

gymnasium = pytest.importorskip("gymnasium")

README = Path(__file__).resolve().parents[1] / "README.md"
HEADING = "### Plugging in your own Gymnasium environment"


class PointEnv(gymnasium.Env):
    """Move a dot onto a target; rgb_array frames, ``is_success`` in ``info``."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, render_mode: str | None = None):
        self.render_mode = render_mode
        self.action_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = gymnasium.spaces.Box(0.0, 1.0, (4,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = np.full(2, 0.5)
        self.goal = self.np_random.uniform(0.1, 0.9, 2)
        return self._obs(), {}

    def _obs(self):
        return np.concatenate([self.pos, self.goal]).astype(np.float32)

    def step(self, action):
        self.pos = np.clip(self.pos + 0.2 * np.asarray(action), 0.0, 1.0)
        success = bool(np.linalg.norm(self.pos - self.goal) < 0.1)
        return self._obs(), float(success), success, False, {"is_success": success}

    def render(self):
        frame = np.zeros((32, 32, 3), np.uint8)
        for (x, y), channel in ((self.goal, 0), (self.pos, 2)):
            frame[int(y * 31), int(x * 31), channel] = 255
        return frame


def readme_example() -> str:
    text = README.read_text()
    assert HEADING in text, f"{README}: no {HEADING!r} section"
    block = re.search(r"```python\n(.*?)```", text.split(HEADING, 1)[1], re.S)
    assert block is not None, f"{README}: no python block after {HEADING!r}"
    return block.group(1)


def test_readme_gymnasium_example_runs(tmp_path):
    """The README's factory, registered as a VLA env, trains one step through `rl train`."""
    import json

    from rl_algos.cli import main
    from rl_algos.config import VLA_ENVS

    namespace = {"__name__": "readme_example"}
    exec(compile(readme_example(), str(README), "exec"), namespace)
    gymnasium.register("MyEnv-v0", entry_point=PointEnv)
    VLA_ENVS.register("my_env", namespace["make_my_env"])
    from omegaconf import OmegaConf

    config = OmegaConf.load(
        Path(__file__).resolve().parents[3] / "examples" / "grpo_vla_reach.yaml"
    )
    config.env = {"name": "my_env", "options": {"image_size": 32}, "num_workers": 2}
    example = tmp_path / "my_env.yaml"
    OmegaConf.save(config, example)
    try:
        code = main(["train", str(example), "trainer.backend=local", f"trainer.output_dir={tmp_path}",
                     "trainer.total_steps=1", "trainer.val_every=1", "trainer.save_every=0",
                     "vla.groups=2", "rollout.n=2", "vla.max_steps=3", "vla.val_episodes=4",
                     "trainer.loggers=[jsonl]"])  # fmt: skip
    finally:
        gymnasium.registry.pop("MyEnv-v0", None)
        VLA_ENVS.unregister("my_env")
    assert code == 0
    history = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [0, 1]
    assert all(0.0 <= h["val/success_rate"] <= 1.0 for h in history)
    assert history[1]["train/mean_length"] >= 1
    assert (tmp_path / "frames" / "val_step0001.png").is_file(), "no validation frames written"

"""The README's "plug in your own Gymnasium environment" example runs as written.

The code block is taken from packages/rl-multimodal/README.md and executed as ``__main__``
with only its sizes made tiny (each replaced string must be present, so a changed README
fails here rather than silently running something else). ``MyEnv-v0`` is registered here
as a small rendered 2-D point env; the env workers are forked, so they see the
registration.
"""

from __future__ import annotations

import multiprocessing as mp
import re
from pathlib import Path

import numpy as np
import pytest

gymnasium = pytest.importorskip("gymnasium")

README = Path(__file__).resolve().parents[1] / "README.md"
HEADING = "### Plugging in your own Gymnasium environment"
# (README text, tiny replacement): a one-step run with 2 x 2 episodes and 4 val seeds
PATCHES = [
    ("groups=8, n=4, max_steps=50", "groups=2, n=2, max_steps=3, total_steps=1"),
    ("range(10**4, 10**4 + 16)", "range(10**4, 10**4 + 4)"),
]


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


@pytest.mark.skipif(
    "fork" not in mp.get_all_start_methods(), reason="spawned workers miss the registration"
)
def test_readme_gymnasium_example_runs(tmp_path, monkeypatch):
    code = readme_example()
    for old, new in PATCHES:
        assert old in code, f"README example: {old!r} not found"
        code = code.replace(old, new)
    gymnasium.register("MyEnv-v0", entry_point=PointEnv)
    monkeypatch.chdir(tmp_path)  # the example writes under outputs/
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(code, str(README), "exec"), namespace)
    finally:
        gymnasium.registry.pop("MyEnv-v0", None)
    history = namespace["history"]
    assert [h["step"] for h in history] == [0, 1]
    assert all(0.0 <= h["val/success_rate"] <= 1.0 for h in history)
    assert history[1]["train/mean_length"] >= 1
    frames = list((tmp_path / "outputs").rglob("val_step0001.png"))
    assert frames, "no validation frames written"

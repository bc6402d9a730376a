"""``reach``: a built-in rendered 2-D reaching task, small enough to learn on a CPU.

The agent (a blue dot) starts at the centre of the unit square, the target (a red dot)
``distance`` away in a direction from the seed. An action in ``[-1, 1]^2`` moves the agent
by ``step_size * action`` (clipped to the square). Within ``radius`` of the target the
episode succeeds and terminates; it is truncated after ``max_steps`` primitive actions. Step
reward: 1 on success plus ``progress_reward`` times the distance decrease (0 by default: why,
the package README). Observations: an ``image_size`` RGB frame, the agent's position as
proprio, the instruction. Pure numpy + PIL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rl_core.env import ActionSpec, EnvObservation, EnvStep, check_action_chunk

__all__ = ["ReachConfig", "ReachEnv"]


@dataclass(frozen=True)
class ReachConfig:
    image_size: int = 56
    distance: float = 0.3
    radius: float = 0.12
    step_size: float = 0.15
    max_steps: int = 6
    n_directions: int = 8  # target directions drawn from the seed (0: any angle)
    max_chunk: int = 4
    progress_reward: float = 0.0  # weight of the distance decrease in the step reward
    instruction: str = "reach the red dot"

    def __post_init__(self) -> None:
        for name in ("distance", "radius", "step_size"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"ReachConfig.{name} is {getattr(self, name)}, expected in (0, 1)")
        if not (np.isfinite(self.progress_reward) and self.progress_reward >= 0):
            raise ValueError(
                f"ReachConfig.progress_reward is {self.progress_reward}, expected a finite value >= 0"
            )
        if self.image_size < 8 or self.max_steps < 1 or self.n_directions < 0:
            raise ValueError(
                f"ReachConfig: image_size {self.image_size} (>= 8), max_steps "
                f"{self.max_steps} (>= 1), n_directions {self.n_directions} (>= 0)"
            )


class ReachEnv:
    """``num_envs`` reach episodes stepped together (a `rl_core.env.VectorEnv`)."""

    def __init__(self, num_envs: int, config: ReachConfig | None = None):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs is {num_envs}, expected >= 1")
        self.num_envs = int(num_envs)
        self.config = config or ReachConfig()
        self.action_spec = ActionSpec([-1.0, -1.0], [1.0, 1.0], max_chunk=self.config.max_chunk)
        n = self.num_envs
        self.agent = np.full((n, 2), 0.5)
        self.target = np.full((n, 2), 0.5)
        self.steps = np.zeros(n, np.int64)
        self.terminated = np.zeros(n, bool)
        self.truncated = np.zeros(n, bool)
        self.success = np.zeros(n, bool)
        self._reset_done = False

    def _target(self, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        c = self.config
        if c.n_directions:
            angle = 2 * np.pi * rng.integers(c.n_directions) / c.n_directions
        else:
            angle = rng.uniform(0, 2 * np.pi)
        return 0.5 + c.distance * np.array([np.cos(angle), np.sin(angle)])

    def render(self, i: int) -> np.ndarray:
        from PIL import Image, ImageDraw

        s = self.config.image_size
        image = Image.new("RGB", (s, s), (0, 0, 0))
        draw = ImageDraw.Draw(image)
        r = max(2.0, s * 0.07)
        for pos, colour in ((self.target[i], (255, 40, 40)), (self.agent[i], (60, 120, 255))):
            x, y = pos[0] * (s - 1), (1 - pos[1]) * (s - 1)
            draw.ellipse((x - r, y - r, x + r, y + r), fill=colour)
        return np.asarray(image, dtype=np.uint8)

    def _observation(self) -> EnvObservation:
        return EnvObservation(
            np.stack([self.render(i) for i in range(self.num_envs)]),
            self.agent.astype(np.float32),
            [self.config.instruction] * self.num_envs,
        )

    def reset(self, seeds: Sequence[int]) -> EnvObservation:
        seeds = [int(s) for s in seeds]
        if len(seeds) != self.num_envs:
            raise ValueError(f"seeds: {len(seeds)} values, expected {self.num_envs}")
        self.agent[:] = 0.5
        self.target = np.stack([self._target(s) for s in seeds])
        self.steps[:] = 0
        self.terminated[:] = self.truncated[:] = self.success[:] = False
        self._reset_done = True
        return self._observation()

    def step(self, actions: np.ndarray) -> EnvStep:
        if not self._reset_done:
            raise RuntimeError("step() before reset(): call reset(seeds) first")
        chunk = check_action_chunk(actions, self.action_spec, self.num_envs)
        c = self.config
        reward = np.zeros(self.num_envs, np.float64)
        for t in range(chunk.shape[1]):
            active = ~(self.terminated | self.truncated)
            if not active.any():
                break
            before = np.linalg.norm(self.agent - self.target, axis=1)
            move = c.step_size * np.clip(chunk[:, t].astype(np.float64), -1, 1)
            self.agent[active] = np.clip(self.agent[active] + move[active], 0.0, 1.0)
            after = np.linalg.norm(self.agent - self.target, axis=1)
            self.steps[active] += 1
            hit = active & (after <= c.radius)
            reward[active] += c.progress_reward * (before - after)[active] + hit[active]
            self.success |= hit
            self.terminated |= hit
            self.truncated |= active & ~hit & (self.steps >= c.max_steps)
        return EnvStep(
            self._observation(),
            reward.astype(np.float32),
            self.terminated.copy(),
            self.truncated.copy(),
            {"success": self.success.copy()},
        )

    def close(self) -> None:
        pass
